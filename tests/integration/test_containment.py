"""No process of a run survives it, not even a daemon built to escape: a rank that
double-forks, calls setsid and execs `env -i sleep` (no TREB_RUN_ID, not in the rank's
process group or session, re-parented away from the rank).

Each case runs twice: with the run's cgroup v2 (runtime/process/contain.py; skipped where this host
has no writable cgroup v2), and with the fallback forced by TREB_TEST_NO_CGROUP=1, a variable
that exists for tests only (process groups, the TREB_RUN_ID scan, the supervisor as child
subreaper). Survivors are read from the process table by the pids the daemons wrote; every
process a test leaves is ended by its pid in `finally`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_faults import assert_no_survivors

pytestmark = pytest.mark.integration

# The daemon sleeps for 3007 s: its command line tells it from a reused pid.
DAEMON_ARGV = b"sleep\x003007\x00"
RANK = r"""
( setsid bash -c 'echo $$ > "$0"; exec env -i sleep 3007' "$TREB_RUN_DIR/daemon-$RANK.pid" \
  </dev/null >/dev/null 2>&1 & )
if [ "$WITH_CHILD" = 1 ]; then
  sleep 3009 & echo $! > "$TREB_RUN_DIR/child-$RANK.pid"
fi
for r in $(seq 0 $((WORLD_SIZE - 1))); do
  while [ ! -s "$TREB_RUN_DIR/daemon-$r.pid" ]; do sleep 0.02; done
done
echo "rank $RANK: daemon up"
case "$1" in
  ok) exit 0 ;;
  fail) if [ "$RANK" = 1 ]; then exit 3; fi ;;
esac
wait
exec sleep 300
"""


def _cgroup_v2_writable() -> bool:
    from trebuchet.runtime.process.contain import candidates

    return any(os.access(os.path.join(d, "cgroup.procs"), os.W_OK) for d in candidates())


@pytest.fixture(params=["cgroup", "fallback"])
def mode(request, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cgroup" and not _cgroup_v2_writable():
        pytest.skip("no writable cgroup v2 on this host: only the fallback can be tested")
    if request.param == "fallback":
        monkeypatch.setenv("TREB_TEST_NO_CGROUP", "1")  # tests only: force the fallback
    else:
        monkeypatch.delenv("TREB_TEST_NO_CGROUP", raising=False)
    return request.param


def _running(pid: int, argv: bytes) -> bool:
    """Alive (not a zombie) and still the process we started, not a reused pid."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return cmd == argv and state != "Z"


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _pids(run_dir: Path, kind: str) -> list[int]:
    return [int(p.read_text()) for p in run_dir.glob(f"{kind}-*.pid")]


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Daemons:
    """The daemons' and children's pids of a run; whatever is left is killed at the end."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def alive(self) -> list[int]:
        if self.run_dir is None:
            return []
        found = [p for p in _pids(self.run_dir, "daemon") if _running(p, DAEMON_ARGV)]
        kids = [p for p in _pids(self.run_dir, "child") if _running(p, b"sleep\x003009\x00")]
        return found + kids

    def assert_none_left(self, run_id: str) -> None:
        assert self.run_dir is not None
        _wait_for(lambda: not self.alive(), 10, f"the daemons of run {run_id} to end")
        assert_no_survivors(run_id)
        rec = (self.run_dir / "cgroup.json").read_text()
        path = json.loads(rec)["path"]
        if path:  # a dead supervisor's: its watchdog's Python removes it once it started
            _wait_for(lambda: not os.path.exists(path), 10, f"cgroup {path} to be removed")

    def end(self) -> None:
        for pid in self.alive():  # the test's own processes, by pid
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def daemons():
    d = Daemons()
    yield d
    d.end()


def _spec(tmp_path: Path, how: str, extra: str = "", world: int = 2) -> Path:
    script = tmp_path / "rank.sh"
    script.write_text(RANK)
    return write_spec(tmp_path, f"command: [bash, {script}, {how}]\nprocs_per_node: {world}\n"
                      + extra)  # fmt: skip


def _check_mode(st: dict, mode: str) -> None:
    """The run was contained the way the test meant (not silently by the other method)."""
    rec = json.loads((Path(st["run_dir"]) / "cgroup.json").read_text())
    assert (rec["path"] is not None) == (mode == "cgroup"), rec


@pytest.mark.parametrize(
    "how,extra,state",
    [("ok", "", "SUCCEEDED"), ("fail", "", "FAILED"), ("sleep", "timeout: 4s\n", "TIMEOUT")],
)
def test_daemon_does_not_outlive_the_run(
    how, extra, state, mode, daemons, treb, tmp_path: Path
) -> None:
    res = treb("run", str(_spec(tmp_path, how, extra)), timeout=120)
    st = status_json(treb)
    daemons.run_dir = Path(st["run_dir"])
    assert st["state"] == state, res.stderr
    _check_mode(st, mode)
    assert len(_pids(daemons.run_dir, "daemon")) == 2  # both daemons were started
    if how == "fail":
        assert st["first_failure"]["rank"] == 1 and st["first_failure"]["exit_code"] == 3
    daemons.assert_none_left(st["id"])


def test_daemon_does_not_outlive_a_cancel(mode, daemons, treb, tmp_path: Path) -> None:
    res = treb("run", str(_spec(tmp_path, "sleep")), "--detach")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    daemons.run_dir = Path(status_json(treb, run_id)["run_dir"])
    _wait_for(lambda: len(_pids(daemons.run_dir, "daemon")) == 2, 60, "the daemons")
    assert treb("cancel", run_id).returncode == 0
    st = status_json(treb, run_id)
    assert st["state"] == "CANCELLED"
    _check_mode(st, mode)
    daemons.assert_none_left(run_id)


def _adopted(run_dir: Path) -> set[int]:
    """The orphans the supervisor adopted and announced to its watchdog (events.jsonl)."""
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return {p for e in events if e["event"] == "adopted" for p in e["pids"]}


def _watchdog_of(supervisor: int) -> int:
    """The supervisor's child that runs trebuchet.launcher.watchdog."""
    for task in os.listdir(f"/proc/{supervisor}/task"):
        for kid in Path(f"/proc/{supervisor}/task/{task}/children").read_text().split():
            if b"trebuchet.launcher.watchdog" in Path(f"/proc/{kid}/cmdline").read_bytes():
                return int(kid)
    raise AssertionError("no watchdog under the supervisor")


def test_leftovers_after_supervisor_and_watchdog_are_killed(
    mode, daemons, treb, tmp_path: Path
) -> None:
    """Both SIGKILLed: the ranks, their children and daemons live on (the watchdog was the
    local ranks' parent-death guard); the next `treb ps` finds and ends them and says so. Without a cgroup,
    only what still carries TREB_RUN_ID can be found once the supervisor (the subreaper)
    is gone, so there the ranks leave children (`sleep 3009 &`), not `env -i` daemons."""
    script = tmp_path / "rank.sh"
    if mode == "cgroup":
        script.write_text(RANK)
    else:
        script.write_text('sleep 3009 & echo $! > "$TREB_RUN_DIR/child-$RANK.pid"\nwait\n')
    spec = write_spec(tmp_path, f"command: [bash, {script}, sleep]\nprocs_per_node: 2\n")
    res = treb("run", str(spec), "--detach", env={"WITH_CHILD": "1"})
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    st = status_json(treb, run_id)
    daemons.run_dir = run_dir = Path(st["run_dir"])
    kinds = ["child", "daemon"] if mode == "cgroup" else ["child"]
    for kind in kinds:
        _wait_for(lambda k=kind: len(_pids(run_dir, k)) == 2, 60, f"{kind} pids")
    sup = status_json(treb, run_id)["supervisor_pid"]
    os.kill(_watchdog_of(sup), signal.SIGKILL)
    os.kill(sup, signal.SIGKILL)
    _wait_for(lambda: _gone(sup), 10, "the supervisor to die")
    assert len(daemons.alive()) == 2 * len(kinds)  # nobody ended them yet
    ps = treb("ps", "--json")
    assert ps.returncode == 0, ps.stderr
    st = status_json(treb, run_id)
    assert st["state"] == "LOST"
    reason = st["attempts"][0]["reason"]
    assert "leftover process(es) ended" in reason, reason
    assert ("in its cgroup" in reason) == (mode == "cgroup"), reason
    events = (run_dir / "events.jsonl").read_text()
    assert "leftover process(es) ended" in events
    _check_mode(st, mode)
    daemons.assert_none_left(run_id)


def test_supervisor_sigkill_alone_ends_daemons(mode, daemons, treb_home, tmp_path: Path) -> None:
    """The watchdog's own path: SIGKILL of an attached `treb run` (the supervisor). Without
    a cgroup the daemons are found because the supervisor, their subreaper, told the
    watchdog about them (they carry no TREB_RUN_ID and are in no group it knows)."""
    spec = _spec(tmp_path, "sleep")
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for(lambda: len(list(treb_home.glob("runs/*/daemon-*.pid"))) == 2, 60, "daemons")
        daemons.run_dir = next(treb_home.glob("runs/*"))
        if mode == "fallback":  # wait until the supervisor told the watchdog about them
            want = set(_pids(daemons.run_dir, "daemon"))
            _wait_for(lambda: want <= _adopted(daemons.run_dir), 30, "the daemons' adoption")
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    daemons.assert_none_left(daemons.run_dir.name)
    events = daemons.run_dir / "events.jsonl"  # written by the watchdog after the kills
    _wait_for(lambda: "watchdog ended its processes" in events.read_text(), 30, "lost event")


def test_supervisor_sigkill_during_an_environment_build_ends_the_build(
    treb_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL of an attached `treb run` while its `environment:` builds (a setup script
    that runs long): the build's processes are the run's too, in its cgroup, so the
    watchdog ends them with the rest (they were outside it and lived on, even past `treb
    ps`: nothing else knows them)."""
    if not _cgroup_v2_writable():
        pytest.skip("no writable cgroup v2 on this host")
    monkeypatch.delenv("TREB_TEST_NO_CGROUP", raising=False)
    (tmp_path / "setup.sh").write_text(f"echo $$ > {tmp_path}/setup.pid\nexec sleep 3011\n")
    spec = write_spec(tmp_path, "command: 'echo hi'\nenvironment:\n  setup: setup.sh\n")
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    pid_file = tmp_path / "setup.pid"
    try:
        _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 120, "the build")
        build = int(pid_file.read_text())
        _wait_for(lambda: _running(build, b"sleep\x003011\x00"), 10, "the setup's sleep")
        proc.kill()
        proc.wait()
        run_dir = next(treb_home.glob("runs/*"))
        events = run_dir / "events.jsonl"
        _wait_for(lambda: "watchdog ended its processes" in events.read_text(), 30, "lost")
        _wait_for(lambda: not _running(build, b"sleep\x003011\x00"), 10, "the build to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid_file.exists() and _running(int(pid_file.read_text()), b"sleep\x003011\x00"):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
