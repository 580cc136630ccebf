"""A helper process that ends a run's processes if its supervisor dies (even by SIGKILL).

PDEATHSIG only reaches a rank's first process; the watchdog also ends what the ranks
started (the run's cgroup, the process groups, the TREB_RUN_ID scan), and records the run
as LOST at once instead of leaving it RUNNING. It is a fresh process in its own session
(a forked copy of the supervisor could not use SQLite safely), so a Ctrl+C or a kill of
the terminal's group does not take it down first. The supervisor writes `+PGID` lines to
its stdin as it starts ranks, `=PID START` for each orphan it adopts, and `done` when it
finishes.
"""

from __future__ import annotations

import sys

# The watchdog process imports only the above (it starts beside the ranks, under `python
# -S`, and every millisecond of its CPU is taken from them): what the supervisor's side and
# the rare EOF path need is imported where used. Not even `signal`, whose enums cost more
# than the whole wait (~10 ms of CPU); the loop ignores the stop signals through `_signal`.


class Watchdog:
    """The supervisor's end of the pipe: announce process groups, then say done."""

    def __init__(self, run_id: str, run_dir: str) -> None:
        import subprocess

        from trebuchet.runtime.process.procs import python_s

        self.proc = subprocess.Popen(
            python_s(__name__, "main", run_id, run_dir),
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        self.pid = self.proc.pid

    def _send(self, line: str, flush: bool = True) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(line.encode())
                if flush:
                    self.proc.stdin.flush()
            except OSError:
                pass

    def watch(self, pgid: int) -> None:
        """Buffered until flush(): a write and a wakeup of the watchdog per rank cost more
        than the start itself. Until then the started ranks die with the supervisor by their
        PDEATHSIG, and the cgroup or TREB_RUN_ID scan finds what they started."""
        self._send(f"+{pgid}\n", flush=False)

    def flush(self) -> None:
        """Tell the watchdog the groups announced so far (after each batch of starts)."""
        self._send("")

    def adopt(self, pid: int, started: str | None) -> None:
        """An orphan the supervisor adopted as subreaper (pid and start time: the pid may
        be reused by the time the watchdog acts)."""
        self._send(f"={pid} {started}\n")

    def done(self) -> None:
        """The supervisor finished on its own: the watchdog leaves without killing. Not
        waited for here (it may still be starting, beside the ranks): wait() reaps it."""
        self._send("done\n")
        if self.proc.stdin:
            import contextlib  # (the supervisor's side: imported already)

            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def wait(self) -> None:
        """Reap the watchdog after done(), at the very end of the supervisor."""
        import contextlib
        import subprocess

        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def main(run_id: str, run_dir: str) -> int:
    import _signal  # signal's C core: the same calls, without its enums

    for sig in (_signal.SIGINT, _signal.SIGHUP, _signal.SIGTERM, _signal.SIGUSR1,
                _signal.SIGUSR2):  # fmt: skip
        _signal.signal(sig, _signal.SIG_IGN)
    groups: set[int] = set()
    adopted: dict[int, str] = {}
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if line == b"done":
            return 0
        if line.startswith(b"+"):
            groups.add(int(line[1:]))
        elif line.startswith(b"="):
            pid, started = line[1:].decode().split()
            adopted[int(pid)] = started
    # EOF without `done`: the supervisor vanished. End everything it started: the process
    # groups, then the run's cgroup and what carries its TREB_RUN_ID (daemons that left
    # their group); the cgroup is removed.
    import os
    import signal

    from trebuchet.runtime.process.contain import end_run
    from trebuchet.runtime.process.procs import alive, descendants, signal_group, signal_pid

    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    # Orphans the supervisor had adopted (without a cgroup, a daemon that cleared its
    # environment is found by nothing else), with what they started.
    tree = [q for p, t in adopted.items() if alive(p, t) for q in [p, *descendants(p)]]
    for pid in tree:
        signal_pid(pid, signal.SIGKILL)
    end_run(run_id, run_dir, {os.getpid()})
    import time

    from trebuchet.store.db import Store
    from trebuchet.store.lifecycle import record

    why = "supervisor died; watchdog ended its processes"
    record(Store(), run_id, "lost", time=time.time(), reason=why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
