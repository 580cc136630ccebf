"""Containment of a run's processes, so that none outlives the run.

Where the kernel lets us, each local run gets a cgroup v2 of its own (as Slurm's
proctrack/cgroup does): the supervisor steps into it while it starts the run's processes
(`inside`, 0.1 ms a move here), so each is in it from its fork without a preexec_fn, and
whatever it forks stays in it, whether it double-forks, calls setsid or empties its
environment. Ending the run is then one write to `cgroup.kill` (or a SIGKILL to every pid
in `cgroup.procs` on kernels without it), and the directory is removed. The path is
recorded in the run directory (`cgroup.json`) so that the watchdog, `treb cancel` and
`treb ps` can end what a dead supervisor left behind.

Without a writable cgroup v2 (a pure v1 host, a non-root user outside a delegated
subtree), the fallback is what trebuchet did before: each process in its own process group,
and a scan of /proc for the run's TREB_RUN_ID; the local supervisor also becomes a child
subreaper (procs.py), so a daemon that cleared its environment is adopted by it, not by
init, and announced to the watchdog.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from ..rundir.records import read_json, write_json
from . import procs

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    import threading
    from typing import Iterable, Iterator

RECORD = "cgroup.json"
# Tests only: force the fallback on a host where cgroup v2 is writable.
NO_CGROUP_ENV = "TREB_TEST_NO_CGROUP"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup2_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    """(root inside the hierarchy, mount point) of every cgroup2 mount this process sees."""
    found = []
    try:
        with open(mountinfo) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            found.append((_unescape(fields[3]), _unescape(fields[4])))
    return found


def own_v2_path(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup in the v2 hierarchy (the `0::` line), or None."""
    try:
        with open(proc_cgroup) as fh:
            for line in fh:
                if line.startswith("0::"):
                    return line[3:].rstrip("\n")
    except OSError:
        pass
    return None


def candidates() -> list[str]:
    """Directories under which a run's cgroup may go: this process's own v2 cgroup, as seen
    through each cgroup2 mount that contains it (a hybrid host mounts it at
    /sys/fs/cgroup/unified, a pure v2 host at /sys/fs/cgroup)."""
    own = own_v2_path()
    if own is None:
        return []
    dirs = []
    for root, mount in cgroup2_mounts():
        root = root.rstrip("/")
        if own != root and not own.startswith(root + "/"):
            continue  # this mount shows another part of the tree
        path = os.path.join(mount, own[len(root) :].lstrip("/"))
        if os.path.isfile(os.path.join(path, "cgroup.procs")):
            dirs.append(os.path.normpath(path))
    return dirs


def cgroup_name(run_id: str) -> str:
    """The name of a run's cgroup (the watchdog finds it by it before cgroup.json says it)."""
    return f"treb-{run_id}"


def create(name: str) -> tuple[str | None, str]:
    """A new cgroup `name` under this process's own: (path, how), or (None, why not)."""
    if os.environ.get(NO_CGROUP_ENV):
        return None, f"no cgroup: {NO_CGROUP_ENV} is set (tests force the fallback)"
    bases = candidates()
    if not bases:
        return None, "no cgroup v2 mount contains this process"
    why = "no writable cgroup v2"
    for base in bases:
        if not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
            why = f"{base} is not writable"
            continue
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as exc:
            why = f"cannot create a cgroup under {base}: {exc.strerror}"
            continue
        return path, "cgroup v2"
    return None, why


# path -> the thread moving this process in (enter_early), and where it says if it did
_ENTERING: dict[str, tuple[threading.Thread, list[bool]]] = {}


def enter_early(path: str | None) -> None:
    """Begin moving this process into the cgroup now, in a thread, for `inside` to finish:
    the kernel makes each move wait out an RCU grace period (10-25 ms here, idle), which
    then passes while the caller writes its records instead of before the first start.
    Until `inside`, the caller must not fork: a fork waits for the move."""
    if not path or path in _ENTERING:
        return
    import threading

    result: list[bool] = []
    begun = threading.Event()

    def enter() -> None:
        begun.set()
        result.append(_write(os.path.join(path, "cgroup.procs"), str(os.getpid())))

    move = threading.Thread(target=enter, name="treb-cgroup-enter", daemon=True)
    move.start()
    begun.wait()  # the caller keeps the GIL from here, but the thread's write has begun
    _ENTERING[path] = (move, result)


def leave_early(path: str | None) -> None:
    """Undo an early move that no `inside` finished (the attempt failed before its first
    start): the process leaves the cgroup, which can then be removed."""
    if path and path in _ENTERING and _enter(path):
        _write(os.path.join(os.path.dirname(path), "cgroup.procs"), str(os.getpid()))


def _enter(path: str) -> bool:
    started = _ENTERING.pop(path, None)
    if started is None:
        return _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))
    move, result = started
    move.join()
    return bool(result and result[0])


@contextlib.contextmanager
def inside(path: str | None) -> Iterator[bool]:
    """Move this process into the cgroup while it starts processes: they are in it from
    their fork (no preexec_fn, so subprocess may vfork), and what they fork stays in it.
    It moves back to the parent cgroup, where it was when it created `path`. If the move
    fails, they start outside it, and the fallback still finds them: it yields whether it
    moved (the caller then gives them their own parent-death signal)."""
    moved = bool(path) and _enter(str(path))
    try:
        yield moved
    finally:
        if moved:
            _write(os.path.join(os.path.dirname(str(path)), "cgroup.procs"), str(os.getpid()))


def members(path: str) -> list[int]:
    """Live processes of the cgroup and of its descendants (nested runs)."""
    pids: list[int] = []
    for folder, _dirs, files in os.walk(path):
        if "cgroup.procs" not in files:
            continue
        with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs")) as fh:
            pids += [int(x) for x in fh.read().split()]
    return [p for p in pids if procs.alive(p, None)]


def kill(path: str, exclude: Iterable[int] = ()) -> list[int]:
    """SIGKILL every process of the cgroup; returns the pids it held. `cgroup.kill` takes
    them all at once, forks in flight included; without it (kernels < 5.14), or when an
    excluded process (the caller) is inside, each pid is killed until none is left."""
    skip = set(exclude)
    found = members(path)
    if not found:
        return []
    if not skip.intersection(found) and _write(os.path.join(path, "cgroup.kill"), "1"):
        return found
    seen = set(found)
    for _ in range(50):  # a forking process may add pids between the read and the kill
        left = [p for p in members(path) if p not in skip]
        if not left:
            break
        seen.update(left)
        for pid in left:
            procs.signal_pid(pid, signal.SIGKILL)
        time.sleep(0.01)
    return sorted(seen - skip)


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return True
    except OSError:
        return False


def remove(path: str, wait: float = 2.0) -> bool:
    """Remove the cgroup (and any nested one), once its killed processes are gone."""
    deadline = time.monotonic() + wait
    while True:
        try:
            for folder, _dirs, _files in os.walk(path, topdown=False):
                os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def record(run_dir: str, path: str | None, how: str) -> None:
    """Say in the run directory how its processes are contained (cancel/refresh read it)."""
    # not fsynced: a cgroup does not outlive a reboot, so its record need not either
    write_json(os.path.join(run_dir, RECORD), {"path": path, "how": how}, durable=False)


def recorded(run_dir: str) -> str | None:
    """The run's cgroup, if it had one and it still exists."""
    rec = read_json(os.path.join(run_dir, RECORD)) or {}
    path = rec.get("path")
    return path if path and os.path.isdir(path) else None


def unrecorded(run_id: str) -> str | None:
    """The run's cgroup under this process's own, found by its name: a supervisor that died
    between making it and recording it (cgroup.json) left it there, empty or not."""
    for base in candidates():
        path = os.path.join(base, cgroup_name(run_id))
        if os.path.isdir(path):
            return path
    return None


def end_run(run_id: str, run_dir: str, exclude: Iterable[int] = (), keep: bool = False,
            scan: bool = True) -> dict[str, list[int]]:  # fmt: skip
    """SIGKILL what is left of a run: its cgroup's processes, then (unless not `scan`)
    every process carrying its TREB_RUN_ID; the cgroup is removed unless `keep` (between
    attempts). Returns the pids found, by method: {"cgroup": [...], "scan": [...]}."""
    skip = set(exclude)
    found: dict[str, list[int]] = {"cgroup": [], "scan": []}
    path = recorded(run_dir) or (
        None if os.path.exists(os.path.join(run_dir, RECORD)) else unrecorded(run_id)
    )
    if path:
        found["cgroup"] = kill(path, skip)
    skip.update(found["cgroup"])
    found["scan"] = [p for p in procs.processes_of_run(run_id, skip)] if scan else []
    for pid in found["scan"]:
        procs.signal_pid(pid, signal.SIGKILL)
    if path and not keep:
        remove(path)
    return found
