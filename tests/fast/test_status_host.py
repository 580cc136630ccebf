"""Every process row says its host (issue 35): a pid means something on its host only, and
on ssh and Slurm a run's processes are on several. `treb status` (a HOST column) and
`--json` (`host` in each of `procs`) give the host the agent recorded; a store made by an
older build (its procs table without the column) gains it on open, its rows then say
none."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.conftest import TrebFn
from trebuchet.store.db import RunRecord, Store


def a_run(treb_home: Path, rid: str = "aaaa2222") -> Store:
    store = Store()
    run_dir = treb_home / "runs" / rid
    run_dir.mkdir(parents=True)
    store.insert_run(RunRecord(id=rid, name="x", backend="ssh", launcher="native", nodes=2,
                               procs_per_node=1, state="FAILED", created_at=1.0,
                               run_dir=str(run_dir)))  # fmt: skip
    return store


def test_status_rows_say_each_process_host(treb: TrebFn, treb_home: Path) -> None:
    store = a_run(treb_home)
    recs = [{"label": f"{n}:0", "rank": n, "node": n, "local_rank": 0, "pid": 4242,
             "exit_code": 1, "host": host, "state": "ENDED"}
            for n, host in enumerate(["ts1", "ts2"])]  # fmt: skip
    store.set_procs("aaaa2222", 0, recs)  # type: ignore[arg-type]
    store.close()
    res = treb("status", "aaaa2222", "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["procs"]
    assert [(p["rank"], p["pid"], p["host"]) for p in rows] == [(0, 4242, "ts1"), (1, 4242, "ts2")]
    text = treb("status", "aaaa2222").stdout
    header = next(line for line in text.splitlines() if "PID" in line)
    assert header.split()[:5] == ["ATTEMPT", "PROC", "RANK", "HOST", "PID"], text
    assert [ln.split()[3] for ln in text.splitlines() if " 4242 " in ln] == ["ts1", "ts2"], text


def test_an_older_store_gains_the_host_column(treb: TrebFn, treb_home: Path) -> None:
    store = a_run(treb_home, "bbbb3333")
    store.set_procs("bbbb3333", 0, [{"label": "0:0", "rank": 0, "node": 0, "pid": 7}])
    store.close()
    with sqlite3.connect(treb_home / "runs.db") as conn:  # as an older build made it
        conn.execute("ALTER TABLE procs DROP COLUMN host")
    res = treb("status", "bbbb3333", "--json")
    assert res.returncode == 0, res.stderr
    assert [(p["pid"], p["host"]) for p in json.loads(res.stdout)["procs"]] == [(7, None)]
