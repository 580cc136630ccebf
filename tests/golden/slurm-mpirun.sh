#!/bin/bash
# trebuchet run RUN_ID (with-mpirun): 2 node(s) x 4 rank(s), launcher mpirun, 1 attempt(s) at most.
# Rendered by `treb render --on slurm`, submitted by `treb run --on slurm`. The job
# controller (attempts, retries, requeue) and the node agents (one srun step per
# attempt) are trebuchet's runtime, shipped in the run directory with job.json.
#SBATCH --job-name=with-mpirun
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --no-requeue
#SBATCH --output=$TREB_HOME/runs/RUN_ID/batch.log
#SBATCH --open-mode=append

TREB_RUN_DIR=$TREB_HOME/runs/RUN_ID
TREB_RUNTIME="$TREB_RUN_DIR"/treb-runtime-VERSION-HASH.pyz
[ -r "$TREB_RUNTIME" ] || { echo "treb: $TREB_RUNTIME not found on $(hostname) (TREB_HOME must be on a filesystem every node shares)" >&2; exit 2; }
# env from the spec; secrets come from the submitting environment, by name
export NCCL_DEBUG=INFO
command -v python3 >/dev/null 2>&1 || { echo "treb: no python3 (>= 3.8) on $(hostname): trebuchet's job controller needs it" >&2; exit 2; }
export TREB_SETUP_ENV_FD=8
exec python3 -S "$TREB_RUNTIME" controller "$TREB_RUN_DIR/job.json" 8< <(env -0)

# ---- $TREB_HOME/runs/RUN_ID/job.json (read by the job controller)
{
  "checkpoint_signal": "SIGUSR2",
  "command": ["bash", "-c", "python train.py --rank \"$RANK\""],
  "grace": 5,
  "inline": false,
  "launcher": "mpirun",
  "master_port": null,
  "max_attempts": 1,
  "mpi_env": ["HF_TOKEN", "NCCL_DEBUG"],
  "nodes": 2,
  "policies": [{"name": "gpu-oom", "action": "no_retry", "pattern": "CUDA out of memory|torch\\.(cuda\\.)?OutOfMemoryError|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED"}, {"name": "missing-module", "action": "no_retry", "pattern": "ModuleNotFoundError: No module named|ImportError: cannot import name"}, {"name": "syntax-error", "action": "no_retry", "pattern": "^\\s*(SyntaxError|IndentationError): "}, {"name": "ecc-error", "action": "retry", "max_retries": 2, "pattern": "uncorrectable ECC error|ECC error encountered"}, {"name": "port-in-use", "action": "retry", "max_retries": 2, "pattern": "EADDRINUSE|Address already in use"}],
  "post": "",
  "ppn": 4,
  "pre": "",
  "requeue_margin": 10,
  "run_dir": "$TREB_HOME/runs/RUN_ID",
  "run_id": "RUN_ID",
  "secrets": ["HF_TOKEN"],
  "spec_env": ["NCCL_DEBUG"],
  "srun": ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL", "--cpus-per-task=8"],
  "srun_hook": ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL"],
  "workdir": "$WORKDIR"
}
