"""Slurm's batch step: the job controller as it runs inside a Slurm job."""
