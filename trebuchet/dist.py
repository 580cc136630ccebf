"""`trebuchet.dist`: helpers for the user's program.

- `init_env()`: the rank variables for a script that srun, mpirun or SkyPilot started
  directly. The contract itself lives in trebuchet/runtime/contracts/rank_env.py (one place
  for every launcher); this module keeps the public name.
- `heartbeat()`: tell the launcher this rank is making progress without printing (a run is
  hung when no rank made progress for `hang_timeout`: docs/hangs.md).
- `enable_stacks()`: let the launcher dump this rank's Python stacks through faulthandler
  where py-spy is not installed (or not allowed to ptrace).
"""

from __future__ import annotations

import os

from trebuchet.runtime.contracts.rank_env import (
    _expand_builtin,
    expand_hostlist,
    init_env,
    slurm_master_port,
)

__all__ = [
    "enable_stacks",
    "expand_hostlist",
    "heartbeat",
    "init_env",
    "slurm_master_port",
    "_expand_builtin",
]


def heartbeat() -> None:
    """Touch `$TREB_HEARTBEAT` (a no-op outside trebuchet): cheap enough for every step."""
    path = os.environ.get("TREB_HEARTBEAT")
    if not path:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a"):
                pass
        except OSError:
            pass
    except OSError:
        pass


_stacks_file = None


def enable_stacks() -> bool:
    """Register faulthandler on the launcher's stacks signal, writing to
    `$TREB_STACKS_FILE`; False outside trebuchet. Only needed where py-spy cannot run."""
    global _stacks_file
    import faulthandler

    from trebuchet.runtime.watch.stacks import STACKS_SIGNAL

    path = os.environ.get("TREB_STACKS_FILE")
    if not path:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if _stacks_file is None:
        _stacks_file = open(path, "a")  # noqa: SIM115 - faulthandler keeps writing to it
    faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True, chain=False)
    return True
