"""`treb stacks` numbers attempts from 1, as `treb status` does (issue 25: it said
`attempt 0` of a run `treb status` showed in attempt 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from trebuchet.runtime.process.procs import hostname, start_time
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir


def treb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())  # fmt: skip


def test_stacks_says_the_attempt_status_says() -> None:
    """A RUNNING run supervised by this test process (alive, so no refresh ends it), in its
    second attempt (index 1, folder attempt-1); no agent answers, so stacks waits briefly."""
    store = Store()
    rid = "5ac50001"
    run = runs_dir() / rid
    (run / "attempt-1").mkdir(parents=True)
    now = time.time()
    store.insert_run(RunRecord(id=rid, name="st", backend="local", launcher="native",
                               state="RUNNING", nodes=1, procs_per_node=1, run_dir=str(run),
                               created_at=now, started_at=now, attempt=1, host=hostname(),
                               supervisor_pid=os.getpid(),
                               supervisor_start=start_time(os.getpid())))  # fmt: skip
    store.set_attempt(rid, 0, state="FAILED")
    store.set_attempt(rid, 1, state="RUNNING")
    status = treb("status", rid).stdout
    assert "attempt 2 of" in status, status
    res = treb("stacks", rid, "--wait", "0.2")
    assert f"run {rid} (st), attempt 2: stacks of 0 of 1 ranks" in res.stdout, res.stdout
    assert str(run / "attempt-1" / "stacks") in res.stdout
    assert store.get(rid).state == "RUNNING"
