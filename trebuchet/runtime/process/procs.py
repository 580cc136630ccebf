"""Process helpers: identity that survives pid reuse, death with the parent, group kills,
adoption of orphaned descendants (child subreaper)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_libc = None


def python_s(module: str, function: str, *args: str) -> list[str]:
    """argv of `python -S` calling `module.function(*args)` and exiting with its result: a
    helper process of our own starts in ~15 ms instead of ~45 (no site, no installed
    packages' .pth files), with the folder (or .pyz) that holds trebuchet on sys.path."""
    root = os.path.abspath(__file__)
    for _ in __name__.split("."):
        root = os.path.dirname(root)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); m = __import__(sys.argv[2], "
        "fromlist=['_']); raise SystemExit(getattr(m, sys.argv[3])(*sys.argv[4:]))"
    )
    return [sys.executable, "-S", "-c", code, root, module, function, *args]


def hostname() -> str:
    """This machine's name, as socket.gethostname() gives it (the same uname(2) nodename)
    without importing socket: ~4 ms of every launch, for one name."""
    return os.uname().nodename


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


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, or a tracer's stop): state T or t."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def zombie(pid: int) -> bool:
    """Ended but not yet reaped (or gone altogether)."""
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def _prctl(option: int, value: int) -> int:
    """libc's prctl(2), through _ctypes: `import ctypes` took ~2.5 ms of every local launch
    (the supervisor becomes a subreaper before the first rank starts), for this one call;
    the few lines below are what ctypes.CDLL(None).prctl builds (the C int result)."""
    global _libc
    if _libc is None:  # here: the watchdog and most agents never call prctl
        import _ctypes

        class CInt(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes.c_int
            _type_ = "i"

        class Function(_ctypes.CFuncPtr):  # CDLL's function type: cdecl, C int result
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = CInt

        class Libc:  # what CFuncPtr((name, library)) reads of a CDLL: its handle
            _handle = _ctypes.dlopen(None, os.RTLD_LOCAL)  # type: ignore[arg-type]  # libc

        _libc = Function(("prctl", Libc()))  # type: ignore[arg-type]  # a CDLL's handle
    return int(_libc(option, value, 0, 0, 0))


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGKILL to this child when its parent dies."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def become_subreaper() -> bool:
    """Orphans among this process's descendants (a daemon that double-forked and called
    setsid) are re-parented to it instead of init, so it can still find and end them."""
    with contextlib.suppress(OSError, AttributeError):
        return _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    return False


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree, parents before their children."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def reap(pids: list[int], timeout: float = 0.0) -> None:
    """Collect the exit status of children nobody else waits for (adopted orphans), waiting
    up to `timeout` for those just killed."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left:
        for pid in list(left):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            except ChildProcessError:
                pass
            left.remove(pid)
        if not left or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _candidates(name: str, path: str | None, cwd: str) -> list[tuple[str, str]]:
    """(as exec is given it, as seen from here) for each file exec would try for `name`: a
    name with a slash, relative to `cwd`; else each folder of `path`, the child's PATH (an
    empty entry: its cwd)."""
    if "/" in name:
        return [(name, os.path.join(cwd, name))]
    folders = (path if path is not None else os.defpath).split(os.pathsep)
    return [
        (full, os.path.join(cwd, full)) for full in (os.path.join(f or ".", name) for f in folders)
    ]


def find_program(name: str, path: str | None, cwd: str) -> str | None:
    """Where exec would find `name` (a name with a slash: relative to `cwd`; else on
    `path`, the child's PATH), or None."""
    for full, here in _candidates(name, path, cwd):
        if os.path.isfile(here) and os.access(here, os.X_OK):
            return here if "/" in name else full
    return None


def exec_error(name: str, path: str | None, cwd: str) -> OSError | None:
    """The error exec would give for `name`, or None where it finds a program: the agent
    reports "cannot start" itself when a helper execs the command (with_pdeathsig). As
    execvp: Permission denied where a candidate exists but cannot be executed (no x bit, a
    directory) and none can, else No such file or directory."""
    denied = False
    for _full, here in _candidates(name, path, cwd):
        if os.path.isfile(here) and os.access(here, os.X_OK):
            return None
        denied = denied or os.path.exists(here)
    code = errno.EACCES if denied else errno.ENOENT
    return OSError(code, os.strerror(code))


def _setpriv() -> str | None:
    for folder in ("/usr/bin", "/bin", "/usr/local/bin"):
        if os.access(f"{folder}/setpriv", os.X_OK):
            return f"{folder}/setpriv"
    return None


SETPRIV = _setpriv()


def with_pdeathsig(argv: list[str]) -> list[str] | None:
    """`argv` behind util-linux's setpriv, which sets the parent-death signal and execs it:
    the same guard as die_with_parent without a preexec_fn, so subprocess can vfork (32
    ranks started in ~60 ms instead of ~95 ms here). None where setpriv is missing."""
    if SETPRIV is None:
        return None
    return [SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a whole process group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


def signal_name(returncode: int) -> str | None:
    """'SIGKILL' for a Popen returncode of -9; None for a normal exit."""
    if returncode >= 0:
        return None
    with contextlib.suppress(ValueError):
        return signal.Signals(-returncode).name
    return f"SIG{-returncode}"


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def processes_of_run(
    run_id: str, exclude: set[int] | None = None, node: int | None = None
) -> list[int]:
    """Every live process whose environment carries TREB_RUN_ID=run_id: the ranks and
    whatever they started, even daemons that left the rank's process group or session.
    `node`: only those that also carry NODE_RANK=node (one node's, where two nodes of a
    run may share a machine, or its PID space)."""
    needles = [f"TREB_RUN_ID={run_id}\0".encode()]
    if node is not None:
        needles.append(f"NODE_RANK={node}\0".encode())
    found = []
    for pid in _pids():
        if exclude and pid in exclude:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = b"\0" + fh.read()
        except OSError:
            continue
        if all(b"\0" + n in env or env.endswith(b"\0" + n[:-1]) for n in needles):
            found.append(pid)
    return [p for p in found if not _is_zombie(p)]


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session,
    ...), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children_by_ppid() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc/*/stat: where the kernel has no
    /proc/<pid>/task/<tid>/children files (CONFIG_PROC_CHILDREN off)."""
    kids: dict[int, list[int]] = {}
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is not None and len(fields) > 1 and fields[1].isdigit():
            kids.setdefault(int(fields[1]), []).append(pid)
    return kids


def _children_file(pid: int) -> list[int] | None:
    """`pid`'s children from its threads' children files; None where the kernel has none."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    kids: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{task}"):
                return None  # the thread is there, its children file is not
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return kids


def left_in_tree(root: int) -> list[int]:
    """What `root`'s processes left below it, parents first: every descendant outside its
    own session. Linear in root's own descendants (their children files), never a read
    of every process on the machine, which on a cluster of simulated nodes (one /proc)
    made each node's sweep cost O(nodes x processes).

    It is complete only where `root` is a child subreaper (become_subreaper) that started
    each of its processes in a session of its own (Agent: start_new_session): an orphan
    (a daemon that double-forked, called setsid, cleared its environment) is re-parented
    to `root`, so it stays in the tree, and nothing can join root's session from another,
    so what is in root's session is root's own helpers (squeue, scontrol), never a rank's.
    Without the children files, one /proc/*/stat pass by ppid."""
    mine = _stat_fields(root)
    if mine is None or len(mine) < 4:
        return []
    session = mine[3]
    by_ppid: dict[int, list[int]] | None = None
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        kids = _children_file(pid) if by_ppid is None else by_ppid.get(pid, [])
        if kids is None:  # no children files in this kernel: one pass over /proc
            by_ppid = _children_by_ppid()
            kids = by_ppid.get(pid, [])
        for kid in kids:
            fields = _stat_fields(kid)
            if fields is None or len(fields) < 4 or (pid == root and fields[3] == session):
                continue  # gone, or root's own helper (and what it started)
            found.append(kid)
            todo.append(kid)
    return found


def ancestors(pid: int) -> list[int]:
    """The parent of `pid`, its parent, ... up to init (from /proc/<pid>/stat)."""
    out: list[int] = []
    while pid > 1 and len(out) < 4096:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.append(pid)
    return out


def in_run(pid: int, run_id: str) -> bool:
    """Whether `pid` carries TREB_RUN_ID=run_id (a recorded pid not yet reused)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return f"TREB_RUN_ID={run_id}".encode() in fh.read().split(b"\0")
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/<pid>/task/*/children when the kernel has it)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
        return kids
    except OSError:
        pass
    for child in _pids():
        try:
            with open(f"/proc/{child}/stat", "rb") as fh:
                if int(fh.read().rsplit(b")", 1)[1].split()[1]) == pid:
                    kids.append(child)
        except (OSError, ValueError, IndexError):
            continue
    return kids


def handles(pid: int, sig: int) -> bool:
    """Whether `pid` has a handler for `sig` (the kernel's SigCgt mask in its status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def catchers(pid: int, sig: int) -> list[int]:
    """The processes under `pid` (itself included) that handle `sig`, the topmost of each
    branch: the rank's own handler, not the bash in front of it, a launcher that ignores
    it (torchrun), nor the workers a handling rank forked. A process with the default
    action would die of a checkpoint signal it never asked for, so it is looked through,
    never signalled."""
    found: list[int] = []
    todo, seen = [pid], set()
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.add(p)
        if handles(p, sig):
            found.append(p)
        else:
            todo.extend(children(p))
    return found


def signal_pid(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
