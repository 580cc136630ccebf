"""Stacks of every rank, on request: for a hang (runtime/watch/hung.py) and for `treb stacks RUN`.

The protocol works wherever every node's agent sees the run directory (local, Slurm):
whoever wants stacks writes `attempt-<n>/stacks/request` (a request id); every agent looks
at it each step and, for a new id, dumps the stacks of its own ranks into
`attempt-<n>/stacks/<name>.txt` (rank-3.txt), each file whole once renamed, its first line
`# request <id> ...` and the method used, then `# host <node>` and `# tried: ...` lines
(so a diagnosis can say "no stacks on tn2: py-spy not found there"). The asker waits for
the files (bounded).

How: `py-spy dump --pid P --native` (py-spy on PATH, beside sys.executable, or
`$TREB_PY_SPY`; native frames tell where a rank waits inside C++: DDP's reducer, a NCCL
kernel); without --native when that fails; then with --nonblocking (read without
suspending the process: the only way into a stopped one, which a suspending py-spy cannot
attach to, so a stopped rank gets it first, and its file says `# state stopped`); else
faulthandler, when the program called `trebuchet.dist.enable_stacks()` (the agent sees
the handler in /proc/<pid>/status SigCgt): the agent sends `STACKS_SIGNAL` and takes what
the program wrote. py-spy runs as a child of the agent, never waited for: supervision goes
on meanwhile. Every rank's dump runs at once and each has DUMP_DEADLINE_S in all, whatever
its methods, so that what waits for the stacks (the hang watch: hang.STACKS_WAIT_S) waits
a few seconds at most. A failed py-spy is said with its own reason (`pyspy_reason`: its
`Error:` line and the causes under it), never the last line of a Rust backtrace.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from ..process.procs import handles, hostname, stopped
from ..rundir.records import writable_fd, write_text
from ..rundir.regular import open_regular, read_text
from .display_lines import shown

STACKS_DIR = "stacks"
REQUEST = "request"
# Default action: ignore. The ranks run in sessions of their own, with no terminal that
# could send it; the checkpoint signals (USR1/USR2) stay the checkpoint machinery's.
STACKS_SIGNAL = signal.SIGWINCH
FLAGS = ("--native", "--nonblocking")  # the py-spy options a file's method names
DUMP_DEADLINE_S = 6.0  # one process's dump, every method together (a hung py-spy too)
FAULTHANDLER_WAIT_S = 3.0
REASON_MAX = 300
CAUSE_NUMBER = re.compile(r"^\d+: ")
# py-spy prints Rust's backtrace under its error when the environment asks for one
PY_SPY_ENV = {"RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}


def stacks_dir(adir: str) -> str:
    return os.path.join(adir, STACKS_DIR)


def faulthandler_path(adir: str, name: str) -> str:
    """Where `enable_stacks()` makes faulthandler write (`$TREB_STACKS_FILE`)."""
    return os.path.join(stacks_dir(adir), name + ".faulthandler")


def request(adir: str) -> str:
    """Ask every agent of the attempt for its ranks' stacks; returns the request id."""
    os.makedirs(stacks_dir(adir), mode=0o700, exist_ok=True)
    rid = f"{time.time():.6f}-{os.getpid()}"
    write_text(os.path.join(stacks_dir(adir), REQUEST), rid + "\n", durable=False)
    return rid


def _asked_at(rid: str) -> float | None:
    try:
        return float(rid.partition("-")[0])
    except ValueError:
        return None


def answered(adir: str, rid: str) -> dict[str, str]:
    """The stack files that answer request `rid`, or a later request, so far: {name: path}.
    A later one counts (its stacks are newer than asked for): where several deciders share
    a run directory (the node agents of ssh hosts on a shared filesystem), the last request
    written is the one the agents answer, and every decider must see those answers."""
    since = _asked_at(rid)
    folder = stacks_dir(adir)
    out: dict[str, str] = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for fname in names:
        if not fname.endswith(".txt") or fname.startswith("."):
            continue
        path = os.path.join(folder, fname)
        try:
            with open_regular(path) as fh:
                head = fh.readline(4096).decode(errors="replace")
        except OSError:
            continue
        got = head[len("# request ") :].split(" ", 1)[0] if head.startswith("# request ") else ""
        if got == rid or (since is not None and (_asked_at(got) or 0.0) >= since):
            out[fname[:-4]] = path
    return out


def find_py_spy() -> str | None:
    """py-spy: `$TREB_PY_SPY` (empty: do not use it), PATH, or beside this Python."""
    if "TREB_PY_SPY" in os.environ:
        return os.environ["TREB_PY_SPY"] or None
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


class Dump:
    """One process's dump in flight: py-spy (native, then plain), else faulthandler."""

    def __init__(self, adir: str, name: str, pid: int, rid: str) -> None:
        self.adir, self.name, self.pid, self.rid = adir, name, pid, rid
        self.out = os.path.join(stacks_dir(adir), f".{name}.py-spy")
        self.popen: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []  # the popen's
        self.deadline = 0.0
        self.tried: list[str] = []  # what failed, said in the file
        self.methods: list[list[str]] = []
        self.fh_size = 0
        self.ends = time.monotonic() + DUMP_DEADLINE_S  # every method's, together
        self.stopped = stopped(pid)  # SIGSTOP (`treb fault hang-rank`), a debugger
        spy = find_py_spy()
        if spy:
            base = [spy, "dump", "--full-filenames", "--pid", str(pid)]
            quiet = [*base, "--nonblocking"]  # reads the memory, never suspends the process
            self.methods = [quiet] if self.stopped else [[*base, "--native"], base, quiet]
        else:
            self.tried.append("py-spy not found (install py-spy on the nodes)")
        self.fh_started = False
        self.done = False
        self._next()

    def _next(self) -> None:
        """Start the next method, or finish with what is known."""
        if self.methods and time.monotonic() >= self.ends:
            self.tried.append(f"py-spy: no stacks within {DUMP_DEADLINE_S:g}s")
            self.methods = []
        if self.methods:
            argv = self.argv = self.methods.pop(0)
            fd = writable_fd(self.out, truncate=True)  # a rank's FIFO there is replaced
            try:
                self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd,
                                              stderr=subprocess.STDOUT, close_fds=True,
                                              env={**os.environ, **PY_SPY_ENV})  # fmt: skip
            except OSError as exc:
                self.tried.append(f"{argv[0]}: {exc.strerror}")
                self.popen = None
                return self._next()
            finally:
                os.close(fd)
            self.deadline = self.ends
            return None
        self.popen = None
        if not self.fh_started and handles(self.pid, STACKS_SIGNAL):
            self.fh_started = True
            path = faulthandler_path(self.adir, self.name)
            self.fh_size = os.path.getsize(path) if os.path.exists(path) else 0
            try:
                os.kill(self.pid, STACKS_SIGNAL)
            except OSError as exc:
                self.tried.append(f"faulthandler: {exc.strerror}")
                self._finish("none", "")
                return None
            self.deadline = max(
                min(time.monotonic() + FAULTHANDLER_WAIT_S, self.ends), time.monotonic() + 0.5
            )  # its own bound, within the dump's
            return None
        if not self.fh_started:
            self.tried.append(
                "faulthandler: not registered (call trebuchet.dist.enable_stacks() in the program)"
            )
        self._finish("none", "")

    def step(self) -> bool:
        """Advance; True once the file is written."""
        if self.done:
            return True
        now = time.monotonic()
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is None and now < self.deadline:
                return False
            how = " ".join(["py-spy dump", *(a for a in self.argv if a in FLAGS)])
            if rc is None:
                self.popen.kill()
                self.popen.wait()
                self.tried.append(f"{how}: no answer within {DUMP_DEADLINE_S:g}s")
            text = _read(self.out)
            if rc == 0 and text.strip():
                return self._finish(how.replace(" dump", ""), text)
            if rc is not None:
                self.tried.append(f"{how}: {pyspy_reason(text) or f'exit code {rc}'}")
            self._next()
            return self.done
        if self.fh_started:
            path = faulthandler_path(self.adir, self.name)
            text = _read(path)[self.fh_size :]
            # faulthandler writes from the signal handler, all at once: done when it ends in
            # the main thread's outermost frame, or when the wait is over.
            if ("<module>" in text and text.endswith("\n")) or now >= self.deadline:
                return self._finish("faulthandler" if text.strip() else "none", text)
        return False

    def _finish(self, method: str, text: str) -> bool:
        header = [f"# request {self.rid} method {method} pid {self.pid}", f"# host {hostname()}"]
        self.stopped = self.stopped or stopped(self.pid)  # a stop that came during the dump
        if self.stopped:
            header.append("# state stopped")
        header += [f"# tried: {t}" for t in self.tried]
        if method == "none":
            header.append("# no stacks: py-spy was not usable and faulthandler not registered")
        body = "\n".join(header) + "\n" + text
        write_text(os.path.join(stacks_dir(self.adir), self.name + ".txt"), body, durable=False)
        with contextlib.suppress(OSError):
            os.unlink(self.out)
        self.done = True
        return True

    def cancel(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def pyspy_reason(text: str) -> str:
    """py-spy's own reason for a failed dump, one shown line: its last `Error:` line and
    the causes listed under it ("Failed to get stack traces: Failed to suspend process:
    unexpected waitpid result ..."), without a Rust backtrace; else its last line; '' when
    it said nothing."""
    lines = [ln.strip() for ln in text.splitlines()]
    at = max((i for i, ln in enumerate(lines) if ln[:6].lower() == "error:"), default=None)
    if at is None:
        said = [ln for ln in lines if ln]
        return shown(said[-1])[:REASON_MAX] if said else ""
    parts = [lines[at][6:].strip()]
    causes = False
    for ln in lines[at + 1 :]:
        if ln == "Caused by:":
            causes = True
        elif ln.startswith("Stack backtrace:") or (ln and not causes):
            break
        elif ln:
            cause = CAUSE_NUMBER.sub("", ln, count=1)
            if cause != parts[-1]:  # io errors are listed twice ("No such file ... (os error 2)")
                parts.append(cause)
    return shown(": ".join(p for p in parts if p))[:REASON_MAX]


def _read(path: str) -> str:
    try:
        return read_text(path, 4 << 20)
    except OSError:
        return ""


class Stacks:
    """An agent's side: a new request -> a Dump per live tracked process."""

    def __init__(self, adir: str) -> None:
        self.adir = adir
        self.path = os.path.join(stacks_dir(adir), REQUEST)
        self.seen_mtime = 0.0
        self.seen_id = ""
        self.dumps: list[Dump] = []

    def step(self, procs: dict[str, int]) -> None:
        """`procs`: the live processes to dump ({name: pid})."""
        self.dumps = [d for d in self.dumps if not d.step()]
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return
        if mtime == self.seen_mtime:
            return
        self.seen_mtime = mtime
        rid = _read(self.path).strip()
        if not rid or rid == self.seen_id:
            return
        self.seen_id = rid
        for name, pid in procs.items():
            self.dumps.append(Dump(self.adir, name, pid, rid))
        self.dumps = [d for d in self.dumps if not d.step()]

    def close(self) -> None:
        for d in self.dumps:
            d.cancel()
        self.dumps = []
