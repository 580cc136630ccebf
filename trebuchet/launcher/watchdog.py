"""A forked helper that ends a run's process groups if its supervisor dies (even by SIGKILL).

PDEATHSIG only reaches a rank's first process; the watchdog also ends what the ranks
started, and records the run as LOST at once instead of leaving it RUNNING. It lives in
its own session, so a Ctrl+C or a kill of the terminal's group does not take it down first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from trebuchet.launcher.procs import processes_of_run, signal_group


class Watchdog:
    """The supervisor's end of the pipe: announce process groups, then say done."""

    def __init__(self, run_id: str, run_dir: str) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            code = 0
            try:
                os.close(w)
                _child(r, run_id, run_dir)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(r)
        self._w: int | None = w
        self.pid = pid

    def watch(self, pgid: int) -> None:
        if self._w is not None:
            os.write(self._w, f"+{pgid}\n".encode())

    def done(self) -> None:
        """The supervisor finished on its own: the watchdog leaves without killing."""
        if self._w is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._w, b"done\n")
        os.close(self._w)
        self._w = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _child(r: int, run_id: str, run_dir: str) -> None:  # pragma: no cover - forked child
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.closerange(0, r)
    os.closerange(r + 1, 1 << 16)
    groups: set[int] = set()
    buf = b""
    while True:
        data = os.read(r, 4096)
        if not data:
            break
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line == b"done":
                return
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
    # The supervisor vanished without saying done: end everything it started.
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    for pid in processes_of_run(run_id, {os.getpid()}):  # daemons that left their group
        os.kill(pid, signal.SIGKILL)
    from trebuchet.store.db import Store
    from trebuchet.store.files import append_event
    from trebuchet.store.states import LOST

    store = Store()
    if store.update_run(run_id, only_if_active=True, state=LOST, ended_at=time.time()):
        append_event(__import__("pathlib").Path(run_dir), "lost", reason="supervisor died")
