"""launcher/watchdog.py with real processes: it waits as a small shell beside the ranks,
leaves on `done` without killing, and when its supervisor's pipe ends without `done` it ends
the process groups and the adopted orphans it was told about (not a reused pid)."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from trebuchet.launcher.watchdog import NAME, WAIT, Watchdog
from trebuchet.runtime.process import contain
from trebuchet.runtime.process.procs import start_time


def _sleeper() -> subprocess.Popen[bytes]:
    """A process in a session (and group) of its own, as a rank is started."""
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _wait_exit(proc: subprocess.Popen[bytes], limit: float = 30.0) -> int | None:
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None


def _end(*procs: subprocess.Popen[bytes]) -> None:
    """Whatever of the test's own processes still runs, killed and reaped (by pid)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_waits_as_a_shell_ignores_stop_signals_and_leaves_on_done(tmp_path: Path) -> None:
    wd = Watchdog(uuid.uuid4().hex[:8], str(tmp_path))
    rank = _sleeper()
    try:
        wd.watch(rank.pid)
        wd.flush()
        exe = os.path.basename(os.readlink(f"/proc/{wd.pid}/exe"))
        assert not exe.startswith("python"), exe  # no interpreter while the run goes on
        assert b"trebuchet.launcher.watchdog" in Path(f"/proc/{wd.pid}/cmdline").read_bytes()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            os.kill(wd.pid, sig)  # a Ctrl+C or a TERM of everything does not take it down
        wd.adopt(rank.pid, start_time(rank.pid))  # it still reads (an ignored signal)
        assert wd.proc.poll() is None
        wd.done()
        assert _wait_exit(wd.proc) == 0
        assert rank.poll() is None  # `done`: nothing of the run is killed
    finally:
        _end(rank, wd.proc)


def test_a_vanished_supervisor_has_its_groups_and_adopted_orphans_killed(tmp_path: Path) -> None:
    wd = Watchdog(uuid.uuid4().hex[:8], str(tmp_path))
    rank, orphan, reused = _sleeper(), _sleeper(), _sleeper()
    try:
        wd.watch(rank.pid)
        wd.flush()
        wd.adopt(orphan.pid, start_time(orphan.pid))
        wd.adopt(reused.pid, "1")  # that pid is another process now: left alone
        assert wd.proc.stdin is not None
        wd.proc.stdin.close()  # the supervisor's end of the pipe, gone without `done`
        assert _wait_exit(wd.proc) == 0
        assert _wait_exit(rank) == -signal.SIGKILL
        assert _wait_exit(orphan) == -signal.SIGKILL
        assert reused.poll() is None
    finally:
        _end(rank, orphan, reused, wd.proc)


def test_the_shell_kills_the_runs_cgroup_itself_before_its_python_starts() -> None:
    """Local ranks in a cgroup have no parent-death signal (no setpriv exec per rank): the
    watchdog's shell is their guard, so it kills the run's cgroup (`@PATH`) the moment its
    pipe ends, without waiting for its Python's start; here the Python part cannot start
    at all. A line that names no absolute path is not a cgroup."""
    cgroup, why = contain.create(f"treb-test-{uuid.uuid4().hex[:8]}")
    if cgroup is None:
        pytest.skip(f"no writable cgroup v2 here: {why}")
    rank, outside = _sleeper(), _sleeper()
    shell = subprocess.Popen(["/bin/sh", "-c", WAIT, NAME, "/bin/false"], stdin=subprocess.PIPE,
                             start_new_session=True)  # fmt: skip
    try:
        Path(cgroup, "cgroup.procs").write_text(str(rank.pid))
        assert shell.stdin is not None
        shell.stdin.write(f"@relative\n@{cgroup}\n+{outside.pid}\n".encode())
        shell.stdin.close()  # the supervisor vanished
        assert _wait_exit(shell) == 1  # /bin/false, exec'd with the lines
        assert _wait_exit(rank) == -signal.SIGKILL
        assert outside.poll() is None  # a told group is Python's to kill, not the shell's
    finally:
        _end(rank, outside, shell)
        contain.remove(cgroup)


def test_a_supervisor_dead_before_it_recorded_its_cgroup_leaves_none(tmp_path: Path) -> None:
    """The supervisor made the run's cgroup (`treb-<run id>`) and died before cgroup.json
    said so (SIGKILL during its imports, 2 of 15 random kills here): the watchdog finds
    the cgroup by its name, ends what is in it and removes it (it stayed, empty, forever)."""
    from trebuchet.runtime.process import contain

    if not any(os.access(os.path.join(d, "cgroup.procs"), os.W_OK) for d in contain.candidates()):
        pytest.skip("no writable cgroup v2 on this host")
    run_id = uuid.uuid4().hex[:8]
    wd = Watchdog(run_id, str(tmp_path))  # first, outside the cgroup (as begin() does)
    path, how = contain.create(contain.cgroup_name(run_id))
    assert path is not None, how
    rank = _sleeper()
    try:
        Path(path, "cgroup.procs").write_text(str(rank.pid))
        assert wd.proc.stdin is not None
        wd.proc.stdin.close()  # no cgroup.json yet, no group told
        assert _wait_exit(wd.proc) == 0
        assert _wait_exit(rank) == -signal.SIGKILL
        assert not os.path.exists(path)
        assert not (tmp_path / contain.RECORD).exists()
    finally:
        _end(rank, wd.proc)
        if os.path.isdir(path):
            contain.remove(path)


def test_a_group_said_ended_is_not_killed_but_one_told_again_is(tmp_path: Path) -> None:
    """`-PGID`: the group ended and its id may be another's by now (left alone); a group
    told again after that (a later rank given the same pid) is the run's once more."""
    wd = Watchdog(uuid.uuid4().hex[:8], str(tmp_path))
    gone, again, kept = _sleeper(), _sleeper(), _sleeper()
    try:
        for pid in (gone.pid, again.pid, kept.pid):
            wd.watch(pid)
        wd.forget(gone.pid)
        wd.forget(again.pid)
        wd.watch(again.pid)
        wd.flush()
        assert wd.proc.stdin is not None
        wd.proc.stdin.close()  # the supervisor vanished
        assert _wait_exit(wd.proc) == 0
        assert _wait_exit(again) == -signal.SIGKILL
        assert _wait_exit(kept) == -signal.SIGKILL
        assert gone.poll() is None
    finally:
        _end(gone, again, kept, wd.proc)


PDEATHSIG = (
    "import ctypes\nv = ctypes.c_int()\n"
    "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
    "print('pdeathsig', v.value)\n"
)


def test_ranks_keep_their_death_signal_when_the_cgroup_move_fails(tmp_path: Path) -> None:
    """A watched agent's ranks go without a parent-death signal because the run's cgroup
    holds them; where the move into it fails (the cgroup is gone, a write refused), they
    start outside it and get the signal as without a cgroup: a rank that left its group and
    cleared its environment would otherwise be found by nothing once the supervisor died."""
    import sys

    from trebuchet.runtime.node.agent import Agent, Proc
    from trebuchet.runtime.process.procs import SETPRIV

    if SETPRIV is None:
        pytest.skip("no setpriv here: every rank gets its death signal by a preexec_fn")
    (tmp_path / "pdeath.py").write_text(PDEATHSIG)
    proc = Proc("rank-0", "0:0", [sys.executable, str(tmp_path / "pdeath.py")],
                {"PATH": os.environ["PATH"]}, rank=0)  # fmt: skip
    gone = str(tmp_path / "no-such-cgroup")  # the move's write fails: no such directory
    agent = Agent([proc], str(tmp_path), str(tmp_path), 0.3, cgroup=gone, watched=True)
    agent.start_all()
    assert proc.popen is not None
    assert proc.popen.wait(timeout=60) == 0
    assert "pdeathsig 9" in (tmp_path / "rank-0.log").read_text()


def test_a_new_attempt_empties_the_shells_list() -> None:
    """`!` (each attempt after the first): the last attempt's lines go, so the list the
    shell keeps (and execs its Python with) holds one attempt's, never a run's retries
    (300,000 lines of a long run of retries took the shell minutes, past ARG_MAX)."""
    lines = "".join(f"+{1000 + i}\n-{1000 + i}\n" for i in range(500)) + "!\n+7\n=8,9\n"
    done = subprocess.run(["/bin/sh", "-c", WAIT, NAME, "/bin/sh", "-c", 'echo "$@"', "x"],
                          input=lines.encode(), capture_output=True, timeout=60)  # fmt: skip
    assert done.stdout.decode().split() == ["+7", "=8,9"]
