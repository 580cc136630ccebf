"""`trebuchet.dist`: helpers for the user's program.

- `init_env()`: the rank variables for a script that srun, mpirun or SkyPilot started
  directly. The contract itself lives in trebuchet/runtime/contracts/rank_env.py (one place
  for every launcher); this module keeps the public name.
- `heartbeat()`: tell the launcher this rank is making progress without printing (a run is
  hung when no rank made progress for `hang_timeout`: docs/hangs.md).
- `mark("step", n)` / `mark("checkpoint", n)`: exact step and checkpoint marks for the
  goodput accounting and the no-progress rule; `mark("compute", n)` before the step's
  collective, for the straggler watch (docs/goodput.md); without trebuchet
  installed the same is one line:
  `open(os.environ["TREB_MARKS"], "a").write(f"{time.time()} step {n}\\n")`.
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
    "mark",
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


def mark(kind: str, n: float | None = None) -> None:
    """Append `<time> <kind> <n>` to `$TREB_MARKS` (a no-op outside trebuchet): `kind` is
    "step", "checkpoint" (call it once the checkpoint is on disk) or "compute" (this rank's
    own work for step n is done: call it just before the step's collective, so that a
    straggler shows, docs/goodput.md). One short append a call; never raises."""
    path = os.environ.get("TREB_MARKS")
    if not path or kind not in ("step", "checkpoint", "compute"):
        return
    import math
    import time

    base, rank = os.path.basename(path), os.environ.get("RANK", "")
    if base.startswith("node-") and rank.isdigit():  # torchrun's workers share the node's
        path = os.path.join(os.path.dirname(path), f"rank-{rank}")  # file: each its own

    tail = ""
    try:  # a tensor, numpy's, 10**400, NaN, "8\n...": a finite number or none (one line)
        v = float(n) if n is not None else math.nan
    except Exception:  # noqa: BLE001 - never raises
        v = math.nan
    if math.isfinite(v):
        tail = f" {int(v)}" if v.is_integer() and abs(v) < 2**53 else f" {v!r}"
    try:
        with open(path, "a") as fh:
            fh.write(f"{time.time():.6f} {kind}{tail}\n")
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
