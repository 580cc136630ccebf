"""Two Store objects in one process (a sweep driver: the runner's and its own) keep seeing
what other processes write. Opening a second fd of runs.db and closing it drops this
process's POSIX locks (SQLite's caveat): another process's close then deleted the WAL, and
the driver read a stale snapshot for ever (a sweep waited on runs that had ended)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trebuchet.store.db import RunRecord, Store


def test_a_second_store_in_one_process_keeps_seeing_other_writers(treb_home: Path) -> None:
    first = Store()
    first.insert_run(RunRecord(id="aaaa1111", name="x", backend="local", launcher="native",
                               nodes=1, procs_per_node=1, state="RUNNING", created_at=1.0,
                               run_dir=str(treb_home / "runs" / "aaaa1111")))  # fmt: skip
    second = Store()  # as sweep.drive() opens its own beside the runner's
    assert second.get("aaaa1111").state == "RUNNING"
    writer = (
        "from trebuchet.store.db import Store\n"
        "s = Store(); s.write_state('aaaa1111', state='SUCCEEDED'); s.close()\n"
    )
    for _ in range(2):  # the writer's close is the one that checkpointed and deleted the WAL
        subprocess.run([sys.executable, "-c", writer], check=True, timeout=60)
    assert second.get("aaaa1111").state == "SUCCEEDED"
    assert first.get("aaaa1111").state == "SUCCEEDED"
    wal = Path(str(second.path) + "-wal")
    assert wal.exists(), "another process deleted the WAL this process still uses"
