"""`trebuchet.dist.init_env()`: the rank variables for a script that srun, mpirun or SkyPilot
started directly. The contract itself lives in trebuchet/runtime/contract.py (one place for
every launcher); this module keeps the public name."""

from __future__ import annotations

from trebuchet.runtime.contract import (
    _expand_builtin,
    expand_hostlist,
    init_env,
    slurm_master_port,
)

__all__ = ["expand_hostlist", "init_env", "slurm_master_port", "_expand_builtin"]
