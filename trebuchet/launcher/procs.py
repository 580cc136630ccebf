"""Process helpers: identity that survives pid reuse, death with the parent, group kills."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1
_libc = None


def start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so split after its ')'.
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def alive(pid: int | None, started: str | None) -> bool:
    """True while the process that was `pid` at `started` still runs (not a reused pid)."""
    if not pid:
        return False
    now = start_time(pid)
    if now is None:
        return False
    if _is_zombie(pid):
        return False
    return started is None or now == started


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGKILL to this child when its parent dies."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a whole process group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def signal_name(returncode: int) -> str | None:
    """'SIGKILL' for a Popen returncode of -9; None for a normal exit."""
    if returncode >= 0:
        return None
    with contextlib.suppress(ValueError):
        return signal.Signals(-returncode).name
    return f"SIG{-returncode}"
