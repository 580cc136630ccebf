"""A Slurm job that can never start says so, on the real test cluster.

Why: 5 nodes asked of the 2-node `debug` partition (with --no-check) is accepted by
sbatch and then pends forever; `treb ps`, `treb status` (and --json) and the attached view
must name Slurm's reason and say that it will not start, and a job that merely waits
(a begin time) must not be called stuck.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    slurm,
    slurm_conf,
    status,
    streb,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
NEVER = "will not start: partition debug has 2 nodes, the job asks for 5"


def wait_waiting(streb, rid: str, timeout: float = 60) -> dict:
    """`treb status --json` once Slurm has given the job a reason to show."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(streb, rid)
        if st.get("waiting") and st["waiting"]["reason"] not in ("PartitionConfig",):
            return st  # PartitionConfig comes first, for a moment, for this job
        assert time.monotonic() < deadline, st
        time.sleep(0.5)


def test_too_many_nodes_says_it_will_not_start(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: toobig\ncommand: 'true'\nnodes: 5\n")
    res = streb("run", str(spec), "--on", "slurm", "--no-check", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_waiting(streb, rid)
    assert st["state"] == "PENDING"
    assert st["waiting"]["reason"] == "PartitionNodeLimit" and st["waiting"]["starts"] is False
    assert st["waiting"]["meaning"] == NEVER
    ps = streb("ps")
    assert f"{rid}: {NEVER} (Slurm: PartitionNodeLimit)" in ps.stdout, ps.stdout
    assert "PENDING (PartitionNodeLimit)" in ps.stdout
    text = streb("status", rid).stdout
    assert f"{NEVER} (Slurm: PartitionNodeLimit)" in text, text
    res = streb("cancel", rid)
    assert res.returncode == 0 and "CANCELLED" in res.stdout, res.stderr
    st = status(streb, rid)
    assert st["waiting"] is None and "will not start" not in streb("ps").stdout


def test_a_job_that_waits_is_not_called_stuck(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: later\ncommand: 'true'\n"
                                "slurm: {sbatch_args: ['--begin=now+600']}\n")  # fmt: skip
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    st = wait_waiting(streb, rid)
    assert st["waiting"] == {"reason": "BeginTime", "meaning": "waiting for its begin time",
                             "starts": True, "source": "Slurm"}  # fmt: skip
    ps = streb("ps").stdout
    assert "PENDING (BeginTime)" in ps and "will not start" not in ps, ps
    assert streb("cancel", rid).returncode == 0


def test_attached_view_says_it_will_not_start(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: toobig\ncommand: 'true'\nnodes: 5\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "slurm", "--no-check"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    seen: list[str] = []  # stderr's lines, read in a thread (a buffered pipe fools select)
    reader = threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(NEVER in line for line in list(seen)):
            assert time.monotonic() < deadline and proc.poll() is None, seen
            time.sleep(0.2)
        time.sleep(3)  # a few more polls: the line must not be repeated
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
        reader.join(timeout=10)
    finally:
        proc.kill()
    said = [line for line in seen if NEVER in line]
    assert len(said) == 1, seen  # once, not at every poll
    assert said[0].endswith("); Ctrl+C cancels it\n"), said
    assert proc.returncode == 130, seen
    st = status(streb)
    assert st["state"] == "CANCELLED"
    q = slurm("squeue", "-h", "-t", "all", "-j", st["backend_id"], "-o", "%T")
    assert q.stdout.strip() == "CANCELLED", q
