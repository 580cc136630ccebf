"""The Slurm engine, in one folder: engine.py (BACKEND: render, sbatch, follow, cancel),
options.py (the `slurm:` block), checks.py (its preflight checks), script.py (the sbatch
script and job.json), argv.py (sbatch_args as sbatch reads them), array.py (a sweep as one
job array), state.py (a run's state from its records and squeue), reasons.py (why a job
waits), diagnosis.py (what `treb diagnose` says of a refused or lost job).

Empty on purpose: the registry imports engine.py or options.py, each only when needed.
"""
