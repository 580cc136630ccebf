"""`treb results` shows a cancelled or lost run as CANCELLED or LOST, not FAILURE (issue 25):
madengine's SUCCESS and FAILURE keep their meaning, and neither says what happened to a run
that was stopped or whose supervisor vanished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from trebuchet.results import table
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir

STATES = {"a1000001": "SUCCEEDED", "a1000002": "FAILED", "a1000003": "CANCELLED",
          "a1000004": "LOST", "a1000005": "TIMEOUT"}  # fmt: skip
WANT = {"a1000001": "SUCCESS", "a1000002": "FAILURE", "a1000003": "CANCELLED",
        "a1000004": "LOST", "a1000005": "FAILURE"}  # fmt: skip


def treb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())  # fmt: skip


@pytest.fixture
def store() -> Store:
    store = Store()
    for i, (rid, state) in enumerate(STATES.items()):
        run = runs_dir() / rid
        (run / "attempt-0").mkdir(parents=True)
        (run / "attempt-0" / "rank-0.log").write_text("performance: 12.5 samples_per_second\n")
        (run / "spec.json").write_text(json.dumps({"name": "bench", "command": "x"}))
        now = time.time() - 100 + i
        store.insert_run(RunRecord(id=rid, name="bench", backend="local", launcher="native",
                                   state=state, nodes=1, procs_per_node=1, run_dir=str(run),
                                   created_at=now, started_at=now, ended_at=now + 1))  # fmt: skip
    return store


def test_status_column_keeps_cancelled_and_lost(store: Store) -> None:
    res = treb("results", *STATES, "--json")
    assert res.returncode == 0, res.stderr
    got = {r["run_id"]: r["status"] for r in json.loads(res.stdout)}
    assert got == WANT
    shown = treb("results", *STATES).stdout.splitlines()
    for rid, status in WANT.items():
        row = next(line for line in shown if line.startswith(rid))
        assert row.split()[2] == status, row


def test_rows_stored_before_say_it_too(store: Store) -> None:
    table.ensure(store.conn)
    table.save(store, "a1000003", [{"model": "bench", "workload": "bench", "status": "FAILURE",
                                    "run_state": "CANCELLED", "performance": 12.5}])  # fmt: skip
    assert [r["status"] for r in table.load(store.conn, "a1000003")] == ["CANCELLED"]
    assert [r["status"] for r in table.of_workload(store.conn, "bench")] == ["CANCELLED"]


def test_status_rule() -> None:
    assert table.status("SUCCEEDED", 1.0) == "SUCCESS"
    assert table.status("SUCCEEDED", None) == "FAILURE"  # nothing reported: madengine's FAILURE
    assert table.status("CANCELLED", 1.0) == "CANCELLED"
    assert table.status("LOST", None) == "LOST"
    assert table.status("FAILED", 1.0) == "FAILURE"


def test_trend_keeps_a_run_behind_the_rows_of_removed_ones(store: Store) -> None:
    """The dashboard's trend is the latest rows of runs still in the index: rows that
    `treb rm` left behind (1,000 of them, newer) do not push a kept run's row out."""
    from trebuchet.ui.pages import results_page

    table.ensure(store.conn)
    old = {"model": "bench", "workload": "bench", "status": "SUCCESS", "performance": 1.0}
    table.save(store, "a1000001", [{**old, "created_at": time.time() - 50}])
    table.save(store, "b9999999", [{**old, "created_at": time.time() + i} for i in range(1000)])
    page = results_page(store, {"workload": "bench"})
    assert "a1000001" in page
    assert "b9999999" not in page
