"""Stacks of every rank, on request: for a hang (runtime/watch/hung.py) and `treb stacks RUN`.

Whoever wants stacks writes `attempt-<n>/stacks/request`; every agent seeing the run
directory dumps its own ranks' into `stacks/<name>.txt`, with `# host` and `# tried:` lines
so a diagnosis can say "no stacks on tn2: py-spy not found there".

How: `py-spy dump --native` (native frames tell where a rank waits inside C++: DDP's
reducer, a NCCL kernel), then without --native, then --nonblocking (the only way into a
stopped rank, which gets it first); else faulthandler, where the program called
`trebuchet.dist.enable_stacks()`. py-spy is never waited for, and each dump has
DUMP_DEADLINE_S in all, so the hang watch waits a few seconds at most.
"""

from __future__ import annotations

import contextlib
import json
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
from .paths import faulthandler_path, stacks_dir

REQUEST = "request"
# Default action: ignore. The ranks run in sessions of their own, with no terminal that
# could send it; the checkpoint signals (USR1/USR2) stay the checkpoint machinery's.
STACKS_SIGNAL = signal.SIGWINCH
FLAGS = ("--native", "--nonblocking")  # the py-spy options a file's method names
DUMP_DEADLINE_S = 6.0  # one process's dump, every method together (a hung py-spy too)
FAULTHANDLER_WAIT_S = 3.0
REASON_MAX = 300
JSON_MAX = 16 << 20  # py-spy's JSON dump read (its threads' frames, as fields)
FIELD_MAX = 1000  # a name's or file's characters in a stack file
CAUSE_NUMBER = re.compile(r"^\d+: ")
# py-spy prints Rust's backtrace under its error when the environment asks for one
PY_SPY_ENV = {"RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}


def request(adir: str) -> str:
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
    """{name: path} of the stack files that answer `rid`, or a later request: where several
    deciders share a run directory (ssh hosts on a shared filesystem), the agents answer
    the last request written, and every decider must see those answers."""
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
    if "TREB_PY_SPY" in os.environ:
        return os.environ["TREB_PY_SPY"] or None
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


class Dump:
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
            base = [spy, "dump", "--json", "--full-filenames", "--pid", str(pid)]
            quiet = [*base, "--nonblocking"]  # reads the memory, never suspends the process
            self.methods = [quiet] if self.stopped else [[*base, "--native"], base, quiet]
        else:
            self.tried.append("py-spy not found (install py-spy on the nodes)")
        self.fh_started = False
        self.done = False
        self._next()

    def _next(self) -> None:
        if self.methods and time.monotonic() >= self.ends:
            self.tried.append(f"py-spy: no stacks within {DUMP_DEADLINE_S:g}s")
            self.methods = []
        if self.methods:
            argv = self.argv = self.methods.pop(0)
            fd = writable_fd(self.out, truncate=True)  # a rank's FIFO there is replaced
            try:
                self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd,
                                              stderr=subprocess.STDOUT, close_fds=True,
                                              env={**os.environ, **PY_SPY_ENV},
                                              start_new_session=True)  # fmt: skip
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
        if self.done:
            return True
        now = time.monotonic()
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is None and now < self.deadline:
                return False
            how = " ".join(["py-spy dump", *(a for a in self.argv if a in FLAGS)])
            if rc is None:
                _kill(self.popen)
                self.tried.append(f"{how}: no answer within {DUMP_DEADLINE_S:g}s")
            text = _read(self.out, JSON_MAX)
            dumped = render(text, self.pid) if rc == 0 else None
            if dumped:
                return self._finish(how.replace(" dump", ""), dumped)
            if rc == 0:
                said = pyspy_reason(text)[:120]
                self.tried.append(f"{how}: not a py-spy dump" + (f" ({said})" if said else ""))
            elif rc is not None:
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
            _kill(self.popen)


def _kill(popen: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(popen.pid, signal.SIGKILL)
    popen.kill()
    popen.wait()


def pyspy_reason(text: str) -> str:
    """py-spy's last `Error:` line and the causes under it, never a Rust backtrace's last line."""
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


def render(text: str, pid: int) -> str:
    """py-spy's JSON dump as its text dump, the main thread first; '' when it is none. JSON:
    a thread name or command line holds any text, which the file shows inert."""
    at = text.find("[")
    try:
        data, _ = json.JSONDecoder().raw_decode(text, at) if at >= 0 else (None, 0)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(data, list) or not data:
        return ""
    threads = [t for t in data if isinstance(t, dict) and isinstance(t.get("frames"), list)]
    threads.sort(key=lambda t: t.get("os_thread_id") != pid)
    out = []
    for t in threads:
        tid = t.get("os_thread_id") or t.get("thread_id")
        state = ("active" if t.get("active") else "idle") + ("+gil" if t.get("owns_gil") else "")
        name = t.get("thread_name")
        out.append(f"Thread {_field(tid)} ({state})" + (f': "{_field(name)}"' if name else ""))
        for f in t["frames"]:
            if not isinstance(f, dict):
                continue
            line = f.get("line")
            at_line = f":{line}" if isinstance(line, int) and line > 0 else ""
            out.append(f"    {_field(f.get('name'))} ({_field(f.get('filename'))}{at_line})")
    return "\n".join(out) + "\n" if out else ""


def _field(value: object) -> str:
    return shown(str(value))[:FIELD_MAX]


def _read(path: str, limit: int = 4 << 20) -> str:
    try:
        return read_text(path, limit)
    except OSError:
        return ""


class Stacks:
    def __init__(self, adir: str) -> None:
        self.adir = adir
        self.path = os.path.join(stacks_dir(adir), REQUEST)
        self.seen_mtime = 0.0
        self.seen_id = ""
        self.dumps: list[Dump] = []

    def step(self, procs: dict[str, int]) -> None:
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
