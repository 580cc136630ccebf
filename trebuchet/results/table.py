"""Where results are kept: a `results` table in runs.db, and results.json in the run dir.

The table is the index, so `treb results` compares many runs in one query and a run's rows
are computed once, not re-read from its logs every time; results.json travels with a
copied run directory. Every collected run has at least one row (FAILURE, CANCELLED or LOST
without a value), which is also how the table remembers it was collected.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    model TEXT NOT NULL,
    workload TEXT NOT NULL,
    performance REAL,
    metric TEXT,
    status TEXT NOT NULL,
    source TEXT,
    aggregation TEXT,
    backend TEXT,
    launcher TEXT,
    nnodes INTEGER,
    gpus_per_node INTEGER,
    procs_per_node INTEGER,
    n_gpus INTEGER,
    environment TEXT,
    docker_image TEXT,
    git_commit TEXT,
    git_dirty INTEGER,
    machine_name TEXT,
    build_duration REAL,
    test_duration REAL,
    args TEXT,
    run_state TEXT,
    created_at REAL,
    extra TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX IF NOT EXISTS results_model ON results (model, created_at);
"""
COLUMNS = [
    "run_id", "seq", "model", "workload", "performance", "metric", "status", "source",
    "aggregation", "backend", "launcher", "nnodes", "gpus_per_node", "procs_per_node", "n_gpus",
    "environment", "docker_image", "git_commit", "git_dirty", "machine_name", "build_duration",
    "test_duration", "args", "run_state", "created_at", "extra",
]  # fmt: skip


# Ends that are not failures, shown as such in the status column (madengine's SUCCESS and
# FAILURE say neither of a run that was cancelled or lost).
OWN_STATUS = ("CANCELLED", "LOST")


def status(run_state: str | None, value: float | None) -> str:
    """A row's status: SUCCESS (the run succeeded and reported a number), CANCELLED or LOST
    (the run's own end), else FAILURE."""
    if run_state in OWN_STATUS:
        return str(run_state)
    return "SUCCESS" if run_state == "SUCCEEDED" and value is not None else "FAILURE"


def ensure(conn: sqlite3.Connection) -> None:
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'results'").fetchone():
        conn.executescript(SCHEMA)


def load(conn: sqlite3.Connection, run_id: str) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT * FROM results WHERE run_id = ? ORDER BY seq", (run_id,))
    return [_row(r) for r in rows.fetchall()]


def _row(r: Any) -> dict[str, Any]:
    """A stored row as a dict; a performance an older index kept as inf is no value."""
    d = dict(zip(COLUMNS, tuple(r), strict=False)) if not hasattr(r, "keys") else dict(r)
    d["extra"] = json.loads(d.get("extra") or "{}")
    v = d.get("performance")
    if isinstance(v, float) and not math.isfinite(v):
        d["performance"] = None
    if d.get("run_state") in OWN_STATUS:  # stored before these ends had their own status
        d["status"] = d["run_state"]
    return d


def save(store: Any, run_id: str, rows: list[dict[str, Any]]) -> None:
    """Replace the run's rows in one IMMEDIATE transaction (two collectors: same result)."""
    with store.transaction() as c:
        c.execute("DELETE FROM results WHERE run_id = ?", (run_id,))
        for seq, row in enumerate(rows):
            values = {k: row.get(k) for k in COLUMNS}
            values.update(run_id=run_id, seq=seq, extra=json.dumps(row.get("extra") or {}))
            names = ", ".join(COLUMNS)
            marks = ", ".join(f":{k}" for k in COLUMNS)
            c.execute(f"INSERT INTO results ({names}) VALUES ({marks})", values)


# The rows of runs still in the index: `treb rm` leaves a removed run's rows in the table.
OF_RUNS = "SELECT results.* FROM results JOIN runs ON runs.id = results.run_id"


def workloads(conn: sqlite3.Connection) -> list[tuple[str, int, float]]:
    """(workload, rows, latest created) of every workload with results, latest first."""
    ensure(conn)
    return [tuple(r) for r in conn.execute(
        f"SELECT workload, COUNT(*), MAX(created_at) FROM ({OF_RUNS}) GROUP BY workload "
        "ORDER BY MAX(created_at) DESC"
    ).fetchall()]  # fmt: skip


def of_workload(conn: sqlite3.Connection, workload: str, limit: int = 1000) -> list[dict[str, Any]]:
    """One workload's rows, oldest first (a trend), the latest `limit` of them."""
    ensure(conn)
    rows = conn.execute(
        f"SELECT * FROM ({OF_RUNS} WHERE workload = ? ORDER BY results.created_at DESC, "
        "seq LIMIT ?) ORDER BY created_at, seq", (workload, int(limit)),
    ).fetchall()  # fmt: skip
    return [_row(r) for r in rows]
