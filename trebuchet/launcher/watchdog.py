"""A helper process that ends a run's processes if its supervisor dies (even by SIGKILL).

In a run with a cgroup it is the local ranks' parent-death guard (a PDEATHSIG per rank
costs an exec of setpriv each, and reaches only a rank's first process): the moment the
supervisor's pipe ends it kills the run's cgroup (everything the ranks started, forks in
flight included), then the process groups it was told, what carries the run's TREB_RUN_ID
(without a cgroup), and records the run as LOST at once instead of leaving it RUNNING. It
is a fresh process in its own session (a forked copy of the supervisor could not use SQLite
safely), so a Ctrl+C or a kill of the terminal's group does not take it down first. The
supervisor writes `@PATH` once the run's cgroup exists, `+PGID` lines as it starts ranks,
`-PGID` as each one's group ends (a pid is reused: the watchdog must not kill a stranger's
group of that id), `=PID,START` for each orphan it adopts, and `done` when it finishes.

While the run goes on it only waits, so it waits as /bin/sh (WAIT below: ~1.6 MiB resident
and ~1 ms of CPU beside the ranks, where a `python -S` took 8.6 MiB and ~15 ms). Only when
its stdin ends without `done` (the supervisor vanished) does it exec Python (`main`), with
the lines it was told as arguments, to end the run and record it.
"""

from __future__ import annotations

import sys

# The shell's part: the stop signals ignored (inherited by the exec'd Python), the lines
# gathered until `done` (leave) or the end of stdin: then the run's cgroup killed at once
# (`@PATH`, told once it exists: local ranks in a cgroup have no parent-death signal, so
# this is theirs, before Python starts), and exec "$@" with the other lines, for Python to
# read in order (`-PGID` after `+PGID`: that group ended, its id free for a stranger's).
# The shell only appends each line, never loops over the list (4,096 lines: ~75 ms of CPU
# in all, dash reading a byte at a time), and `!` (a new attempt) empties it: it holds one
# attempt's lines, never a whole run's retries (300,000 lines took minutes, past ARG_MAX).
# The lines are the supervisor's own (digits, `+-=,@!`, the cgroup's path): split on
# blanks, never globbed (set -f); the path quoted.
WAIT = (
    "trap '' INT HUP TERM USR1 USR2; set -f; told=; cg=; while IFS= read -r line; do "
    'case $line in done) exit 0;; !) told=;; [+=-]*) told="$told $line";; @/*) cg=${line#@};; '
    'esac; done; [ -n "$cg" ] && echo 1 2>/dev/null >"$cg/cgroup.kill"; exec "$@" $told'
)
# $0 of the shell: its command line names it (the containment tests and the memory bench
# find the watchdog by it).
NAME = "trebuchet.launcher.watchdog"


class Watchdog:
    """The supervisor's end of the pipe: announce process groups, then say done."""

    def __init__(self, run_id: str, run_dir: str) -> None:
        import signal
        import subprocess

        from trebuchet.runtime.process.procs import python_s

        # Blocked from the fork until the shell's trap ignores them (a blocked mask survives
        # exec): a TERM of everything the moment it starts ended it before the trap ran.
        # Here they wait (not lost) for the unblock.
        stops = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2}
        held = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", WAIT, NAME, *python_s(__name__, "main", run_id, run_dir)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True,
            )  # fmt: skip
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
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
        than the start itself. Until then, should the supervisor die, the cgroup finds the
        started ranks and what they started (without a cgroup, the ranks' own death signal
        and the TREB_RUN_ID scan)."""
        self._send(f"+{pgid}\n", flush=False)

    def cgroup(self, path: str) -> None:
        """The run's cgroup, which the shell kills itself the moment the pipe ends (a path
        with a newline is never sent: its first line would name another cgroup)."""
        if path.startswith("/") and "\n" not in path:
            self._send(f"@{path}\n")

    def reset(self) -> None:
        """A new attempt: the last one's ranks were reaped and its strays killed, so what
        the shell gathered for it goes; its list never grows with the run's retries."""
        self._send("!\n")

    def forget(self, pgid: int) -> None:
        """A group that ended (its leader reaped, the rest killed): its id is free for any
        new process group, which the watchdog must not kill with the run."""
        self._send(f"-{pgid}\n")

    def flush(self) -> None:
        """Tell the watchdog the groups announced so far (after each batch of starts)."""
        self._send("")

    def adopt(self, pid: int, started: str | None) -> None:
        """An orphan the supervisor adopted as subreaper (pid and start time: the pid may
        be reused by the time the watchdog acts)."""
        self._send(f"={pid},{started}\n")

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


def main(run_id: str, run_dir: str, *told: str) -> int:
    """The supervisor vanished (its pipe ended without `done`): `told` holds the lines it
    had written, `+PGID`, `-PGID` and `=PID,START`, as the shell gathered them (WAIT)."""
    import _signal  # signal's C core: the same calls, without its enums

    stops = (_signal.SIGINT, _signal.SIGHUP, _signal.SIGTERM, _signal.SIGUSR1, _signal.SIGUSR2)
    for sig in stops:
        _signal.signal(sig, _signal.SIG_IGN)  # ignored by the shell already; run by hand too
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, stops)  # blocked since the fork: ignored now
    groups: set[int] = set()
    adopted: dict[int, str] = {}
    for item in told:  # in the order said: a group told again after its end is back
        if item[:1] in ("+", "-") and item[1:].isdigit():
            (groups.add if item[0] == "+" else groups.discard)(int(item[1:]))
        elif item.startswith("=") and "," in item:
            number, started = item[1:].split(",", 1)
            if number.isdigit():
                adopted[int(number)] = started
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
    sys.exit(main(*sys.argv[1:]))
