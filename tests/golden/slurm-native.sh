#!/bin/bash
# trebuchet run RUN_ID (render-me): 2 node(s) x 2 rank(s), launcher native, 1 attempt(s) at most.
# Rendered by `treb render --on slurm`, submitted by `treb run --on slurm`. The job
# controller (attempts, retries, requeue) and the node agents (one srun step per
# attempt) are trebuchet's runtime, shipped in the run directory with job.json.
#SBATCH --job-name=render-me
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=4
#SBATCH --mem=64G
#SBATCH --account=my-acct
#SBATCH --partition=batch
#SBATCH --qos=high
#SBATCH --constraint=a100&ib
#SBATCH --exclusive
#SBATCH --no-requeue
#SBATCH --output=$TREB_HOME/runs/RUN_ID/batch.log
#SBATCH --open-mode=append
#SBATCH --comment="hello world"
#SBATCH --mail-type=END

TREB_RUN_DIR=$TREB_HOME/runs/RUN_ID
TREB_RUNTIME="$TREB_RUN_DIR"/treb-runtime-VERSION-HASH.pyz
[ -r "$TREB_RUNTIME" ] || { echo "treb: $TREB_RUNTIME not found on $(hostname) (TREB_HOME must be on a filesystem every node shares)" >&2; exit 2; }
# env from the spec; secrets come from the submitting environment, by name
export OMP_NUM_THREADS=3
export QUOTED='it'"'"'s a $value; rm -rf /'
export FROM_SECRET='Bearer '"${HF_TOKEN}"
# slurm.setup
module load cuda/12.4
source /shared/env.sh
command -v python3 >/dev/null 2>&1 || { echo "treb: no python3 (>= 3.8) on $(hostname): trebuchet's job controller needs it" >&2; exit 2; }
export TREB_SETUP_ENV_FD=8
exec python3 -S "$TREB_RUNTIME" controller "$TREB_RUN_DIR/job.json" 8< <(env -0)

# ---- $TREB_HOME/runs/RUN_ID/job.json (read by the job controller)
{
  "checkpoint_signal": "SIGUSR2",
  "command": ["bash", "-c", "python train.py --lr ${LR:-0.1} \"$RANK\" --node ${SLURM_NODEID}"],
  "grace": 5,
  "inline": false,
  "launcher": "native",
  "master_port": 29511,
  "max_attempts": 1,
  "mpi_env": [],
  "nodes": 2,
  "policies": [{"name": "gpu-oom", "action": "no_retry", "pattern": "CUDA out of memory|torch\\.(cuda\\.)?OutOfMemoryError|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED"}, {"name": "missing-module", "action": "no_retry", "pattern": "ModuleNotFoundError: No module named|ImportError: cannot import name"}, {"name": "syntax-error", "action": "no_retry", "pattern": "^\\s*(SyntaxError|IndentationError): "}, {"name": "ecc-error", "action": "retry", "max_retries": 2, "pattern": "uncorrectable ECC error|ECC error encountered"}, {"name": "port-in-use", "action": "retry", "max_retries": 2, "pattern": "EADDRINUSE|Address already in use"}],
  "post": "",
  "ppn": 2,
  "pre": "",
  "requeue_margin": 10,
  "run_dir": "$TREB_HOME/runs/RUN_ID",
  "run_id": "RUN_ID",
  "secrets": ["HF_TOKEN"],
  "spec_env": ["FROM_SECRET", "OMP_NUM_THREADS", "QUOTED"],
  "srun": ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL", "--whole", "--no-kill"],
  "srun_hook": ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--export=ALL"],
  "workdir": "$WORKDIR"
}
