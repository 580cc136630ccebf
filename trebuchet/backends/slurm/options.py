"""The spec's `slurm:` block: what only the Slurm engine reads (engine.py).

A module of its own so that loading a spec does not import the engine, and `treb ps`
(which refreshes Slurm runs through the engine) does not import pydantic.
"""

from __future__ import annotations

from trebuchet.spec.model import Block, Int, allowed


class Slurm(Block):
    """Slurm-specific settings"""

    account: str | None = allowed("a string", "#SBATCH --account", default=None)
    partition: str | None = allowed("a string", "#SBATCH --partition", default=None)
    qos: str | None = allowed("a string", "#SBATCH --qos", default=None)
    time: str | None = allowed(
        "a duration such as 30m, 2h or 1h30m, or a Slurm time such as 04:00:00, 1-00:00:00 "
        "or UNLIMITED (a bare number is minutes, as in sbatch)",
        "#SBATCH --time, the whole job (default: timeout x attempts)",
        default=None,
    )
    exclusive: bool | None = allowed("true or false", "#SBATCH --exclusive", default=None)
    constraint: str | None = allowed("a string", "#SBATCH --constraint", default=None)
    mem: str | None = allowed("a Slurm memory size such as 64G", "#SBATCH --mem", default=None)
    cpus_per_task: Int | None = allowed(
        "an integer between 1 and 4096", "#SBATCH --cpus-per-task", default=None, ge=1,
        le=4096,
    )  # fmt: skip
    mpi: str | None = allowed(
        "an srun --mpi value such as pmix or pmi2", "srun --mpi", default=None
    )
    sbatch_args: list[str] = allowed(
        "a list of strings", "extra #SBATCH options", default_factory=list
    )
    setup: list[str] = allowed(
        "a list of shell lines", "lines run in the batch script before srun",
        default_factory=list, expand=False,
    )  # fmt: skip
