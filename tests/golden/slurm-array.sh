#!/bin/bash
# trebuchet sweep SWEEP: 4 runs as one Slurm job array, at most 2 at once.
# Array task i runs point i's own script, with its output in the point's batch.log.
#SBATCH --job-name=swept
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --partition=debug
#SBATCH --time=00:54:00
#SBATCH --no-requeue
#SBATCH --output=$TREB_HOME/sweeps/SWEEP-%a.log
#SBATCH --open-mode=append
#SBATCH --array=0-3%2

case ${SLURM_ARRAY_TASK_ID:-} in
0) treb_dir=$TREB_HOME/runs/RUN0 ;;  # run RUN0
1) treb_dir=$TREB_HOME/runs/RUN1 ;;  # run RUN1
2) treb_dir=$TREB_HOME/runs/RUN2 ;;  # run RUN2
3) treb_dir=$TREB_HOME/runs/RUN3 ;;  # run RUN3
*) echo "treb: sweep SWEEP: no run for array task ${SLURM_ARRAY_TASK_ID:-?}" >&2; exit 2 ;;
esac
exec >>"$treb_dir/batch.log" 2>&1
exec bash "$treb_dir/submit.sbatch"
