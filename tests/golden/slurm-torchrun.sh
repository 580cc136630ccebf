#!/bin/bash
# trebuchet run RUN_ID (big): 4 node(s) x 8 rank(s), launcher torchrun, 3 attempt(s) at most.
# Rendered by `treb render --on slurm`, submitted by `treb run --on slurm`. The job
# controller (attempts, retries, requeue) and the node agents (one srun step per
# attempt) are trebuchet's runtime, shipped in the run directory with job.json.
#SBATCH --job-name=big
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=48
#SBATCH --gpus-per-node=8
#SBATCH --time=14:08:00
#SBATCH --requeue
#SBATCH --output=$TREB_HOME/runs/RUN_ID/batch.log
#SBATCH --open-mode=append

TREB_RUN_DIR=$TREB_HOME/runs/RUN_ID
TREB_RUNTIME="$TREB_RUN_DIR"/treb-runtime-VERSION-HASH.pyz
[ -r "$TREB_RUNTIME" ] || { echo "treb: $TREB_RUNTIME not found on $(hostname) (TREB_HOME must be on a filesystem every node shares)" >&2; exit 2; }
command -v python3 >/dev/null 2>&1 || { echo "treb: no python3 (>= 3.8) on $(hostname): trebuchet's job controller needs it" >&2; exit 2; }
export TREB_SETUP_ENV_FD=8
exec python3 -S "$TREB_RUNTIME" controller "$TREB_RUN_DIR/job.json" 8< <(env -0)

# ---- $TREB_HOME/runs/RUN_ID/job.json (read by the job controller)
{
  "checkpoint_signal": "SIGUSR1",
  "command": ["python", "-m", "trainer", "--config", "cfg a.yaml"],
  "gpus_per_node": 8,
  "grace": 30,
  "inline": false,
  "launcher": "torchrun",
  "master_port": null,
  "max_attempts": 3,
  "metrics": {"ranks": [0], "prefix": null, "patterns": [], "progress": null, "gpus": 8},
  "mpi_env": [],
  "nodes": 4,
  "policies": [{"name": "gpu-oom", "action": "no_retry", "pattern": "CUDA out of memory|torch\\.(cuda\\.)?OutOfMemoryError|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED"}, {"name": "missing-module", "action": "no_retry", "pattern": "ModuleNotFoundError: No module named|ImportError: cannot import name"}, {"name": "syntax-error", "action": "no_retry", "pattern": "^\\s*(SyntaxError|IndentationError): "}, {"name": "ecc-error", "action": "retry", "max_retries": 2, "pattern": "uncorrectable ECC error|ECC error encountered"}, {"name": "port-in-use", "action": "retry", "max_retries": 2, "pattern": "EADDRINUSE|Address already in use"}],
  "post": "",
  "ppn": 8,
  "pre": "",
  "requeue_margin": 10,
  "run_dir": "$TREB_HOME/runs/RUN_ID",
  "run_id": "RUN_ID",
  "secrets": [],
  "spec_env": [],
  "srun": ["--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL", "--cpus-per-task=48", "--mpi=pmi2", "--no-kill"],
  "srun_hook": ["--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL"],
  "timeout": 7200.0,
  "warning": 60.0,
  "workdir": "$WORKDIR"
}
