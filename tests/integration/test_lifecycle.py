"""Real runs end to end: failures, teardown, cancel, Ctrl+C, SIGKILL of the launcher, secrets."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_for(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# Each rank starts a grandchild in the background and records its pid, to check for orphans.
SLEEPER = 'sleep 300 & echo $! > "$TREB_RUN_DIR/child-$RANK.pid"; echo "rank $RANK up"; wait'


def _child_pids(run_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in run_dir.glob("child-*.pid")]


def test_first_failure_tears_down_the_rest(treb, tmp_path: Path) -> None:
    cmd = 'if [ "$RANK" = 1 ]; then sleep 0.5; echo "boom on $RANK" >&2; exit 3; fi; ' + SLEEPER
    spec = write_spec(tmp_path, f"command: '{cmd}'\nprocs_per_node: 3\n")
    res = treb("run", str(spec), timeout=60)  # the sleepers would take 300 s
    assert res.returncode == 1
    st = status_json(treb)
    assert st["state"] == "FAILED" and st["exit_code"] == 3
    ff = st["first_failure"]
    assert ff["rank"] == 1 and ff["exit_code"] == 3 and not ff["stopped_by_launcher"]
    others = [p for p in st["procs"] if p["rank"] != 1]
    assert all(p["stopped_by_launcher"] for p in others)
    assert "first failure: rank 1 (node 0, local rank 1) exited with code 3" in res.stderr
    assert "boom on 1" in res.stderr  # the failing log's tail is shown
    record = json.loads((Path(st["run_dir"]) / "attempt-0" / "rank-1.json").read_text())
    assert record["exit_code"] == 3 and record["signal"] is None
    for pid in [p["pid"] for p in st["procs"]] + _child_pids(Path(st["run_dir"])):
        _wait_for(lambda pid=pid: _gone(pid), 10, f"pid {pid} to end")


def test_death_by_signal_is_recorded(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'kill -SEGV $$'\n")
    assert treb("run", str(spec)).returncode == 1
    ff = status_json(treb)["first_failure"]
    assert ff["signal"] == "SIGSEGV" and ff["exit_code"] == 139


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "fallback"])
def test_a_command_that_cannot_be_executed_is_named_with_the_real_reason(
    cgroup: bool, treb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script without its x bit and a directory: exec says `Permission denied` for both,
    with or without a cgroup (without one, each rank starts through setpriv, and the check
    before it said `No such file or directory`, as for a missing program)."""
    if not cgroup:
        monkeypatch.setenv("TREB_TEST_NO_CGROUP", "1")  # tests only: force the fallback
    (tmp_path / "plain.sh").write_text("echo hi\n")
    (tmp_path / "folder").mkdir()
    for name in ("./plain.sh", "./folder"):
        spec = write_spec(tmp_path, f"command: [{name}]\nsnapshot: false\n")
        res = treb("run", str(spec))
        assert res.returncode == 1 and "Traceback" not in res.stderr
        log = treb("logs", "--rank", "0").stdout
        assert f"cannot start '{name}': Permission denied" in log, log


def test_missing_executable_fails_cleanly(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: [no-such-program-xyz, --flag]\n")
    res = treb("run", str(spec))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    st = status_json(treb)
    assert st["state"] == "FAILED" and st["first_failure"]["exit_code"] == 127
    assert "cannot start 'no-such-program-xyz'" in treb("logs", "--rank", "0").stdout


def test_detached_run_seen_from_other_processes_and_cancelled(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"command: '{SLEEPER}'\nnodes: 2\nprocs_per_node: 2\n")
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    _wait_for(lambda: len(treb("logs", run_id).stdout.splitlines()) == 4, what="4 ranks up")
    ps = json.loads(treb("ps", "--json").stdout)
    assert (
        [r["id"] for r in ps] == [run_id]
        and ps[0]["state"] == "RUNNING"
        and ps[0]["shape"] == "2x2"
    )
    st = status_json(treb, run_id[:4])  # a unique prefix works
    assert st["id"] == run_id
    logs = treb("logs", run_id).stdout.splitlines()
    assert sorted(logs) == [
        "[0:0] rank 0 up",
        "[0:1] rank 1 up",
        "[1:0] rank 2 up",
        "[1:1] rank 3 up",
    ]
    assert treb("logs", run_id, "--rank", "2").stdout == "rank 2 up\n"
    assert sorted(treb("logs", run_id, "--node", "1").stdout.splitlines()) == [
        "[1:0] rank 2 up",
        "[1:1] rank 3 up",
    ]
    res = treb("cancel", run_id[:5])
    assert res.returncode == 0 and "CANCELLED" in res.stdout
    st = status_json(treb, run_id)
    assert st["state"] == "CANCELLED"
    for pid in (
        [p["pid"] for p in st["procs"]] + _child_pids(Path(st["run_dir"])) + [st["supervisor_pid"]]
    ):
        _wait_for(lambda pid=pid: _gone(pid), 10, f"pid {pid} to end")


def test_ctrl_c_cancels_attached_run_with_130(treb_home: Path, tmp_path: Path, treb) -> None:
    spec = write_spec(tmp_path, f"command: '{SLEEPER}'\nprocs_per_node: 2\n")
    cmd = [sys.executable, "-m", "trebuchet", "run", str(spec)]
    pipe = subprocess.PIPE
    proc = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, start_new_session=True)
    try:
        _wait_for(
            lambda: len(list((treb_home / "runs").glob("*/child-*.pid"))) == 2, what="ranks up"
        )
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl+C does: the whole group
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    st = status_json(treb)
    assert st["state"] == "CANCELLED"
    for pid in [p["pid"] for p in st["procs"]] + _child_pids(Path(st["run_dir"])):
        _wait_for(lambda pid=pid: _gone(pid), 10, f"pid {pid} to end")


def test_sigkill_of_launcher_kills_ranks_and_run_is_lost(
    treb_home: Path, tmp_path: Path, treb
) -> None:
    spec = write_spec(tmp_path, f"command: '{SLEEPER}'\nprocs_per_node: 2\n")
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        _wait_for(
            lambda: len(list((treb_home / "runs").glob("*/child-*.pid"))) == 2, what="ranks up"
        )
        st = status_json(treb)
        assert st["state"] == "RUNNING"
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    for p in st["procs"]:
        _wait_for(lambda pid=p["pid"]: _gone(pid), 10, "rank to die with its launcher")
    assert json.loads(treb("ps", "--json").stdout)[0]["state"] == "LOST"
    # The ranks' own children are ended too: they are not left holding resources.
    for pid in _child_pids(Path(st["run_dir"])):
        _wait_for(lambda pid=pid: _gone(pid), 10, "grandchild to end")


def test_secrets_reach_ranks_but_never_disk(treb, treb_home: Path, tmp_path: Path) -> None:
    secret = "hf_s3cr3t_value_never_on_disk"
    spec = write_spec(
        tmp_path,
        'command: \'test "$HF_TOKEN" = "$EXPECTED" && test "$ALIAS" = "$EXPECTED" && echo ok\'\n'
        "secrets: [HF_TOKEN]\nenv:\n  ALIAS: ${HF_TOKEN}\n",
    )
    env = {"HF_TOKEN": secret, "EXPECTED": secret}
    res = treb("run", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    assert secret not in res.stdout + res.stderr
    assert treb("render", str(spec), env=env).stdout.count(secret) == 0
    res = treb("run", str(spec), "--detach", env=env)
    run_id = res.stdout.strip()
    _wait_for(
        lambda: status_json(treb, run_id)["state"] == "SUCCEEDED", what="detached run to succeed"
    )
    for path in treb_home.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    with sqlite3.connect(treb_home / "runs.db") as db:
        dump = "\n".join(db.iterdump())
    assert secret not in dump


def test_run_directory_is_private(treb, treb_home: Path, tmp_path: Path) -> None:
    assert treb("run", str(write_spec(tmp_path, "command: echo hi\n"))).returncode == 0
    run_dir = Path(status_json(treb)["run_dir"])
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert (treb_home.stat().st_mode & 0o077) == 0
    assert (run_dir / "attempt-0" / "rank-0.log").stat().st_mode & 0o077 == 0


def test_retries_resume_from_checkpoint_dir(treb, tmp_path: Path) -> None:
    # Rank 0 fails attempt 0 after writing (a failing rank 1 could tear rank 0 down before
    # its write, under load).
    cmd = ('echo "attempt $TREB_ATTEMPT" >> "$TREB_CHECKPOINT_DIR/seen-$RANK"; '
           'test "$TREB_ATTEMPT" -ge 1 || test "$RANK" != 0 || exit 5')  # fmt: skip
    spec = write_spec(tmp_path, f"command: '{cmd}'\nprocs_per_node: 2\nretries: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 1
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    seen = (Path(st["run_dir"]) / "checkpoints" / "seen-0").read_text().split("\n")
    assert seen[:2] == ["attempt 0", "attempt 1"]  # TREB_ATTEMPT counts from 0
    # what is shown counts from 1 everywhere: the header, the list, the table, the messages
    assert "retrying as attempt 2" in res.stderr
    text = treb("status").stdout
    assert "attempt 2 of 3" in text, text
    assert re.search(r"^\s+1\s+FAILED\b", text, re.M) and re.search(
        r"^\s+2\s+SUCCEEDED\b", text, re.M
    )
    assert re.search(r"^2\s+0:0\s.*attempt-1/rank-0\.log$", text, re.M), text  # the table
    assert treb("logs", "--attempt", "1").returncode == 0  # attempt-0/
    for missing in ("0", "3"):
        res = treb("logs", "--attempt", missing)
        assert res.returncode == 2 and f"has no attempt {missing}" in res.stderr


def test_timeout_stops_the_attempt(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: sleep 60\ntimeout: 1s\n")
    res = treb("run", str(spec))
    assert res.returncode == 1
    st = status_json(treb)
    assert st["state"] == "TIMEOUT" and st["attempts"][0]["reason"] == "timeout"


def test_a_supervisor_stopped_past_the_timeout_keeps_a_good_end(treb, tmp_path: Path) -> None:
    """SIGSTOP of the supervisor (a suspended laptop, a debugger) past the run's timeout
    while the rank ends well: on SIGCONT its records say how the attempt ended, not the
    clock (it recorded TIMEOUT)."""
    spec = write_spec(tmp_path, "command: 'sleep 1; echo done'\ntimeout: 3s\n")
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    _wait_for(lambda: status_json(treb, run_id).get("supervisor_pid"), what="the supervisor")
    sup = status_json(treb, run_id)["supervisor_pid"]
    os.kill(sup, signal.SIGSTOP)
    try:
        time.sleep(4.5)  # the rank ends after 1 s; the timeout passes at 3 s
    finally:
        os.kill(sup, signal.SIGCONT)
    _wait_for(lambda: status_json(treb, run_id)["state"] != "RUNNING", what="the run's end")
    st = status_json(treb, run_id)
    assert (st["state"], st["attempts"][0]["state"]) == ("SUCCEEDED", "SUCCEEDED"), st


def test_follow_logs_of_a_detached_run_until_it_ends(treb, tmp_path: Path) -> None:
    cmd = 'for i in 1 2 3; do echo "step $i of rank $RANK"; sleep 0.3; done'
    spec = write_spec(tmp_path, f"command: '{cmd}'\nprocs_per_node: 2\n")
    run_id = treb("run", str(spec), "-d").stdout.strip()
    res = treb("logs", "-f", run_id, timeout=60)
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    for rank in (0, 1):
        assert [ln for ln in lines if ln.startswith(f"[0:{rank}]")] == [
            f"[0:{rank}] step {i} of rank {rank}" for i in (1, 2, 3)
        ]
    assert treb("logs", run_id, "--tail", "1").stdout.splitlines() == [
        "[0:0] step 3 of rank 0", "[0:1] step 3 of rank 1"
    ]  # fmt: skip


def _attached_pid_ranks(tmp_path: Path, then: str) -> subprocess.Popen[bytes]:
    """An attached `treb run` of 2 Python ranks that write `rank-N.pid` in the run
    directory, then run `then`."""
    script = tmp_path / "rank.py"
    script.write_text(
        "import os, time\n"
        "open(os.path.join(os.environ['TREB_RUN_DIR'], 'rank-%s.pid' % os.environ['RANK']),"
        f" 'w').write(str(os.getpid()))\n{then}\n"
    )
    spec = write_spec(tmp_path, f"command: [python, {script}]\nprocs_per_node: 2\n")
    return subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def test_ranks_die_with_their_supervisor(treb_home: Path, tmp_path: Path) -> None:
    """An attached `treb run` killed by SIGKILL: its ranks die with it. They have no
    parent-death signal (no setpriv exec per rank); the run's watchdog, a shell outside the
    run's process groups, kills their groups the moment the supervisor's pipe ends."""
    sup = _attached_pid_ranks(tmp_path, "time.sleep(300)")
    try:
        _wait_for(lambda: len(list(treb_home.glob("runs/*/rank-*.pid"))) == 2, 60, "the ranks")
        pids = [int(f.read_text()) for f in treb_home.glob("runs/*/rank-*.pid")]
        sup.kill()
        sup.wait()
        _wait_for(lambda: all(_gone(pid) for pid in pids), 10, "the ranks to die")
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()


def test_without_a_cgroup_each_rank_keeps_its_parent_death_signal(
    treb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cgroup the watchdog could not find a rank that left its group and cleared
    its environment: each rank then gets the kernel's parent-death signal (SIGKILL), set by
    setpriv (no preexec_fn, so subprocess can still vfork)."""
    monkeypatch.setenv("TREB_TEST_NO_CGROUP", "1")  # tests only: force the fallback
    script = tmp_path / "pdeath.py"
    script.write_text(
        "import ctypes\nv = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0)  # PR_GET_PDEATHSIG\n"
        "print('pdeathsig', v.value)\n"
    )
    spec = write_spec(tmp_path, f"command: [python, {script}]\nprocs_per_node: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    for rank in ("0", "1"):
        assert "pdeathsig 9" in treb("logs", "--rank", rank).stdout


def test_a_reused_pid_of_an_ended_rank_is_not_killed_with_the_run(
    treb_home: Path, tmp_path: Path
) -> None:
    """Rank 1 ends early; its pid (its group's id) is then another process's group (here a
    sleeper given that pid through ns_last_pid; pid_max is 32768 on many hosts). The
    supervisor is SIGKILLed: its watchdog kills the run's groups, never that stranger."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    if not os.access(last, os.W_OK):
        pytest.skip("cannot choose the next pid here (ns_last_pid needs CAP_SYS_ADMIN)")
    sup = _attached_pid_ranks(tmp_path, "if os.environ['RANK'] == '0': time.sleep(300)")
    stranger = None
    try:
        _wait_for(lambda: len(list(treb_home.glob("runs/*/rank-*.pid"))) == 2, 60, "the ranks")
        run_dir = next(treb_home.glob("runs/*"))
        ended = run_dir / "attempt-0" / "rank-1.json"
        _wait_for(lambda: ended.exists() and '"ENDED"' in ended.read_text(), 30, "rank 1's end")
        gone = int((run_dir / "rank-1.pid").read_text())
        for _ in range(20):  # another process may take the pid first: try again
            last.write_text(str(gone - 1))
            stranger = subprocess.Popen(["sleep", "3019"], start_new_session=True)
            if stranger.pid == gone:
                break
            stranger.kill()
            stranger.wait()
            stranger = None
        if stranger is None:
            pytest.skip(f"pid {gone} was taken by another process")
        sup.kill()
        sup.wait()
        rank0 = int((run_dir / "rank-0.pid").read_text())
        _wait_for(lambda: _gone(rank0), 10, "rank 0 to die")
        events = run_dir / "events.jsonl"
        _wait_for(lambda: "watchdog ended its processes" in events.read_text(), 30, "lost")
        assert stranger.poll() is None, "the watchdog killed a process group not of the run"
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        if stranger is not None and stranger.poll() is None:
            stranger.kill()
            stranger.wait()
