"""A local sweep point waiting for its turn has no supervisor: a refresh takes it for
queued while its sweep's driver lives (sweeps/<id>.driver.json), for lost once the driver
is gone. Before, every refresh (`treb ps`, `status`, the dashboard) made such a point LOST
60 s after the sweep started, and the driver then skipped it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trebuchet.backends.local import sweep
from trebuchet.backends.local.engine import BACKEND
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import write_json


def pending_point(store: Store, run_dir: Path, rid: str, sweep_id: str) -> RunRecord:
    rec = RunRecord(
        id=rid, name="p", backend="local", launcher="native", state="PENDING", nodes=1,
        procs_per_node=1, run_dir=str(run_dir), created_at=time.time() - 3600,
        sweep_id=sweep_id,
    )  # fmt: skip
    run_dir.mkdir(parents=True)
    store.insert_run(rec)
    return rec


def test_a_queued_point_is_lost_only_with_its_driver(treb_home: Path, tmp_path: Path) -> None:
    treb_home.mkdir()
    store = Store()
    rec = pending_point(store, tmp_path / "a", "aaaa0001", "swp1")
    sweep._say_alive("swp1")  # this process drives it
    BACKEND.refresh(store, [rec])
    assert store.get(rec.id).state == "PENDING"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    write_json(treb_home / "sweeps" / "swp1.driver.json", {"pid": gone.pid, "start": "1"})
    BACKEND.refresh(store, [store.get(rec.id)])
    assert store.get(rec.id).state == "LOST"
    other = pending_point(store, tmp_path / "b", "bbbb0001", "nodriver")  # none ever wrote
    BACKEND.refresh(store, [other])
    assert store.get(other.id).state == "LOST"
