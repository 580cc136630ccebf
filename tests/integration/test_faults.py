"""The fault matrix: each case checks the final state, the root-cause rank, and that no
process of the run survives (read from the process table, not from the launcher's records)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, needs_program, status_json, write_spec
from trebuchet.backends.local.engine import SUPERVISOR

pytestmark = pytest.mark.integration


def survivors(run_id: str) -> list[int]:
    """Processes whose environment still carries this run's id."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"TREB_RUN_ID={run_id}".encode() in env and state != "Z":
            found.append(int(name))
    return found


def assert_no_survivors(run_id: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while survivors(run_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert survivors(run_id) == [], f"orphans of run {run_id}"


def run_case(
    treb, tmp_path: Path, spec_text: str, *args: str
) -> tuple[subprocess.CompletedProcess, dict]:
    res = treb("run", str(write_spec(tmp_path, spec_text)), *args, timeout=120)
    st = status_json(treb)
    assert_no_survivors(st["id"])
    return res, st


PY = sys.executable


@pytest.mark.parametrize(
    "case,body,exit_code,sig",
    [
        ("raises", "raise ValueError('bad batch')", 1, None),
        ("sigkill", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, "SIGKILL"),
        ("segfault", "import ctypes; ctypes.string_at(0)", 139, "SIGSEGV"),
    ],
)
def test_rank_failure_modes(case, body, exit_code, sig, treb, tmp_path: Path) -> None:
    script = tmp_path / "r.py"
    script.write_text(
        "import os, time\n"
        f"if os.environ['RANK'] == '2':\n    time.sleep(0.5)\n    {body}\n"
        "time.sleep(300)\n"
    )
    res, st = run_case(treb, tmp_path, f"command: [{PY}, {script}]\nnodes: 2\nprocs_per_node: 2\n")
    assert res.returncode == 1
    assert st["state"] == "FAILED"
    ff = st["first_failure"]
    assert (ff["rank"], ff["node"], ff["exit_code"], ff["signal"]) == (2, 1, exit_code, sig)
    assert sorted(p["rank"] for p in st["procs"] if p["stopped_by_launcher"]) == [0, 1, 3]


def test_child_that_outlives_its_rank_is_ended(treb, tmp_path: Path) -> None:
    # A daemon that even leaves the rank's session: only the run id finds it.
    cmd = "setsid sleep 300 < /dev/null > /dev/null 2>&1 & sleep 0.5; echo started"
    res, st = run_case(treb, tmp_path, f"command: '{cmd}'\nprocs_per_node: 2\n")
    assert res.returncode == 0 and st["state"] == "SUCCEEDED"
    events = [
        json.loads(x) for x in (Path(st["run_dir"]) / "events.jsonl").read_text().splitlines()
    ]
    assert any(e["event"] == "strays_killed" and len(e["pids"]) == 2 for e in events)


def test_rank_ignoring_sigterm_dies_after_the_grace_period(treb, tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.environ['RANK'] == '0':\n    time.sleep(0.5)\n    raise SystemExit(4)\n"
        "time.sleep(300)\n"
    )
    res, st = run_case(
        treb, tmp_path, f"command: [{PY}, {script}]\nprocs_per_node: 2\ngrace_period: 1s\n"
    )
    assert st["state"] == "FAILED" and st["first_failure"]["rank"] == 0
    other = next(p for p in st["procs"] if p["rank"] == 1)
    assert other["signal"] == "SIGKILL" and other["stopped_by_launcher"]


SLEEPERS = "command: 'echo up; exec sleep $(cat {nap})'\nnodes: 2\nprocs_per_node: 2\n"


@pytest.mark.parametrize("cached", [False, True], ids=["first-run", "spec-cache"])
@pytest.mark.parametrize("sig,code,state", [(signal.SIGINT, 130, "CANCELLED"),
                                            (signal.SIGTERM, 143, "CANCELLED"),
                                            (signal.SIGHUP, 129, "CANCELLED"),
                                            (signal.SIGKILL, -9, "LOST")])  # fmt: skip
def test_signals_to_the_launcher(
    sig, code, state, cached, treb, treb_home: Path, tmp_path: Path, monkeypatch
) -> None:
    """Both ways `treb run` supervises: after an exec (a spec validated now) and in place
    (the same spec again, from the spec cache, pydantic never imported)."""
    nap = tmp_path / "nap"
    spec = write_spec(tmp_path, SLEEPERS.format(nap=nap))
    cmd = [sys.executable, "-m", "trebuchet", "run", str(spec)]
    if cached:
        monkeypatch.delenv("TREB_SPEC_CACHE", raising=False)
        nap.write_text("0\n")
        assert treb("run", str(spec)).returncode == 0  # validated, now in the cache
        monkeypatch.setenv("TREB_HOME", str(tmp_path / "home2"))  # ps and status: the new run
        shutil.copytree(treb_home / "cache", tmp_path / "home2" / "cache")
        treb_home = tmp_path / "home2"
    nap.write_text("300\n")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            logs = list((treb_home / "runs").glob("*/attempt-0/rank-*.log"))
            if len(logs) == 4 and all(p.read_text() for p in logs):
                break
            time.sleep(0.05)
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        in_place = cached or os.environ.get("TREB_SPEC_CACHE") == "always"
        assert (SUPERVISOR.encode() not in argv) == in_place, argv
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if state == "LOST":  # the watchdog records it at once, before any `treb` reconciles
        import sqlite3

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with sqlite3.connect(treb_home / "runs.db") as db:
                (raw,) = db.execute("SELECT state FROM runs").fetchone()
            if raw == "LOST":
                break
            time.sleep(0.05)
        assert raw == "LOST"
        events = (next((treb_home / "runs").iterdir()) / "events.jsonl").read_text()
        assert "watchdog ended its processes" in events
    st = status_json(treb)
    assert_no_survivors(st["id"])
    assert st["state"] == state
    assert st["first_failure"] is None  # nobody failed: the user stopped it
    if state == "LOST":
        assert st["ended_at"] is not None
        # its attempt is not left RUNNING beside a LOST run (on main it was)
        assert [a["state"] for a in st["attempts"]] == ["LOST"], st["attempts"]
        text = treb("status", st["id"]).stdout
        assert re.search(r"^\s+1\s+LOST\b", text, re.M), text


def test_timeout_warns_with_the_checkpoint_signal_then_stops(treb, tmp_path: Path) -> None:
    script = tmp_path / "ckpt.py"
    script.write_text(
        "import os, signal, time, pathlib\n"
        "def ckpt(*_):\n"
        "    d = os.environ['TREB_CHECKPOINT_DIR']\n"
        "    pathlib.Path(d, 'saved-' + os.environ['RANK']).touch()\n"
        "signal.signal(signal.SIGUSR1, ckpt)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    spec = f"command: [{PY}, {script}]\nprocs_per_node: 2\n"
    spec += "timeout: 3s\ntimeout_warning: 2s\ncheckpoint_signal: USR1\n"
    res, st = run_case(treb, tmp_path, spec)
    assert res.returncode == 1 and st["state"] == "TIMEOUT"
    saved = sorted(p.name for p in (Path(st["run_dir"]) / "checkpoints").iterdir())
    assert saved == ["saved-0", "saved-1"]
    assert all(p["stopped_by_launcher"] for p in st["procs"])


def test_checkpoint_signal_reaches_only_processes_that_handle_it(treb, tmp_path: Path) -> None:
    """The timeout warning goes to the process that handles it, through the bash in front of
    it (a string command), not to its child that would die of it; a rank without a handler
    gets nothing and runs on (on main it died of SIGUSR2 60 s before the limit)."""
    script = tmp_path / "ck.py"
    script.write_text(
        "import os, signal, subprocess, sys, time, pathlib\n"
        "mark = pathlib.Path(os.environ['TREB_CHECKPOINT_DIR'], 'got')\n"
        "deadline = time.time() + 60\n"
        "if os.environ['RANK'] == '1':  # no handler: must not be killed by the warning\n"
        "    while not mark.exists() and time.time() < deadline:\n        time.sleep(0.05)\n"
        "    print('survived', flush=True)\n    raise SystemExit(0)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR2, lambda *_: got.append(1))\n"
        "while not got and time.time() < deadline:\n    time.sleep(0.05)\n"
        "alive = child.poll() is None\n"
        "child.kill()\n"
        "print(f'got={bool(got)} child_alive={alive}', flush=True)\n"
        "mark.touch()\n"
        "raise SystemExit(0 if got and alive else 9)\n"
    )
    spec = f"command: {PY} {script}; echo after-$RANK\nprocs_per_node: 2\n"
    spec += "timeout: 40s\ntimeout_warning: 36s\n"
    res, st = run_case(treb, tmp_path, spec)
    assert res.returncode == 0 and st["state"] == "SUCCEEDED", res.stdout + res.stderr
    assert "got=True child_alive=True" in res.stdout and "survived" in res.stdout
    assert "after-0" in res.stdout and "after-1" in res.stdout  # bash in front lived on
    events = [
        json.loads(x) for x in (Path(st["run_dir"]) / "events.jsonl").read_text().split("\n") if x
    ]
    warning = next(e for e in events if e.get("event") == "timeout_warning")
    assert warning["delivered"] == 1, warning


def test_checkpoint_signal_nobody_handles_is_not_sent(treb, tmp_path: Path) -> None:
    """No rank handles it: nothing is sent, the terminal says so, the ranks run to the
    timeout and are stopped by it (SIGTERM), not by the warning."""
    spec = "command: exec sleep 600\nprocs_per_node: 2\ntimeout: 6s\ntimeout_warning: 4s\n"
    res, st = run_case(treb, tmp_path, spec)
    assert res.returncode == 1 and st["state"] == "TIMEOUT"
    assert "no rank handles SIGUSR2" in res.stdout + res.stderr
    for p in st["procs"]:
        assert p["stopped_by_launcher"] and p["signal"] != "SIGUSR2", p


@pytest.mark.parametrize("launcher", ["native", "torchrun"])
def test_usr1_is_forwarded_to_every_rank(launcher, treb, treb_home: Path, tmp_path: Path) -> None:
    if launcher == "torchrun":
        needs("torch")
    script = tmp_path / "usr1.py"
    script.write_text(
        "import os, signal, time, pathlib\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda *_: got.append(1))\n"
        "pathlib.Path(os.environ['TREB_RUN_DIR'], 'ready-' + os.environ['RANK']).touch()\n"
        "deadline = time.time() + 60\n"
        "while not got and time.time() < deadline:\n    time.sleep(0.05)\n"
        "print('got USR1' if got else 'no signal', flush=True)\n"
        "raise SystemExit(0 if got else 9)\n"
    )
    spec = write_spec(
        tmp_path, f"command: [{PY}, {script}]\nnodes: 2\nprocs_per_node: 2\nlauncher: {launcher}\n"
    )
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(list((treb_home / "runs").glob("*/ready-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().count("got USR1") == 4
    assert_no_survivors(status_json(treb)["id"])


def test_log_policy_no_retry_stops_retries(treb, tmp_path: Path) -> None:
    cmd = "echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1"
    res, st = run_case(treb, tmp_path, f'command: "{cmd}"\nretries: 3\n')
    assert res.returncode == 1 and st["state"] == "FAILED"
    assert len(st["attempts"]) == 1 and st["attempts"][0]["reason"] == "gpu-oom: no_retry"
    assert "log policy gpu-oom (no_retry) matched" in res.stderr


def test_log_policy_retry_goes_past_retries_but_is_bounded(treb, tmp_path: Path) -> None:
    spec = (
        "command: 'echo flaky interconnect; exit 1'\nretries: 1\nlog_policies:\n"
        "  - {name: flaky, pattern: 'flaky interconnect', action: retry, max_retries: 2}\n"
    )
    res, st = run_case(treb, tmp_path, spec)
    assert st["state"] == "FAILED"
    assert len(st["attempts"]) == 4  # 1 + 2 granted by the policy + 1 of `retries`


def test_digits_ddp_resumes_from_its_checkpoint(treb, tmp_path: Path) -> None:
    needs("torch")
    needs("sklearn")
    job = REPO / "examples" / "digits-ddp" / "job.yaml"
    clean = treb("run", str(job), "-o", "command=python train.py --epochs 5", timeout=600)
    assert clean.returncode == 0, clean.stderr[-2000:]
    drill = "command=python train.py --epochs 5 --crash-after-epoch 2"
    crashed = treb("run", str(job), "-o", drill, "-o", "retries=1", timeout=600)
    assert crashed.returncode == 0, crashed.stderr[-2000:]
    st = status_json(treb)
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    assert st["attempts"][0]["reason"] == "failure"
    assert "resumed from epoch 2" in crashed.stdout

    def epochs(text: str) -> dict[int, float]:
        return {
            int(e): float(v) for e, v in re.findall(r"\[0:0\] epoch (\d+) loss ([0-9.]+)", text)
        }

    a, b = epochs(clean.stdout), epochs(crashed.stdout)
    assert sorted(b) == [1, 2, 3, 4, 5]  # the epoch counter continues: 3 follows 2
    for e in range(1, 6):
        assert abs(a[e] - b[e]) < 1e-3, (e, a[e], b[e])
    acc = [float(x) for x in re.findall(r"accuracy: ([0-9.]+)", clean.stdout + crashed.stdout)]
    assert len(acc) == 2 and abs(acc[0] - acc[1]) < 1e-3
    assert_no_survivors(st["id"])


@pytest.mark.parametrize("launcher", ["torchrun", "mpirun"])
def test_agent_launchers_name_the_failing_rank(launcher: str, treb, tmp_path: Path) -> None:
    """Under torchrun/mpirun trebuchet supervises agents; each worker's wrapper records its
    own outcome, so the root cause is the rank (and its exit code), not "torchrun exited 1"."""
    if launcher == "torchrun":
        needs("torch")
    else:
        needs_program("mpirun")
    script = tmp_path / "fail3.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '3':\n    time.sleep(1)\n    print('boom', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(300)\n"
    )
    spec = f"command: [{PY}, {script}]\nnodes: 2\nprocs_per_node: 2\nlauncher: {launcher}\n"
    res, st = run_case(treb, tmp_path, spec)
    assert res.returncode == 1 and st["state"] == "FAILED", res.stderr
    ff = st["first_failure"]
    assert (ff["rank"], ff["node"], ff["local_rank"], ff["exit_code"]) == (3, 1, 1, 3), ff
    assert ff["log"].endswith("attempt-0/rank-3.log") and st["exit_code"] == 3
    ranks = {p["rank"]: p for p in st["procs"] if p["rank"] is not None}
    assert sorted(ranks) == [0, 1, 2, 3], st["procs"]
    assert ranks[3]["exit_code"] == 3 and not ranks[3]["stopped_by_launcher"]
    assert all(ranks[r]["stopped_by_launcher"] for r in (0, 1, 2)), st["procs"]
    assert "rank 3 (node 1, local rank 1) exited with code 3" in res.stderr


def test_progress_bar_is_a_few_lines_on_the_attached_terminal(treb, tmp_path: Path) -> None:
    """A 1,000-step \r bar (tqdm's way) on an attached `treb run`: the terminal shows its
    latest state (on main: 1,000 lines); the rank's log keeps every update."""
    script = tmp_path / "bar.py"
    script.write_text(
        "import sys, time\n"
        "print('epoch 0', flush=True)\n"
        "for i in range(1, 1001):\n"
        "    sys.stdout.write(f'\\r{i}/1000'); sys.stdout.flush()\n"
        "    time.sleep(0.001)\n"
        "print()\n"
    )
    res, st = run_case(treb, tmp_path, f"command: [{PY}, {script}]\n")
    assert res.returncode == 0, res.stderr
    shown = [ln for ln in res.stdout.splitlines() if ln.startswith("[0:0] ")]
    assert shown[0] == "[0:0] epoch 0" and shown[-1] == "[0:0] 1000/1000", shown
    assert len(shown) < 30, shown  # one state a second at most while it runs
    log = Path(st["run_dir"]) / "attempt-0" / "rank-0.log"
    assert log.read_bytes().count(b"\r") == 1000
