"""The metrics store stays bounded: ingest a generated metrics file of N values.

Writes one agent-format file (`attempt-0/metrics/rank-0.jsonl`, runtime/watch/metric_reader.py) with
`--values` values over `--names` metric names (one line a step holding every name), ingests
it into a fresh store in two halves (as `treb metrics` would during and after a run), and
reports the ingest time, the rows kept, the store's size on disk and the file's size.
Usage: python bench/metrics_store.py [--values 10000000] [--names 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--values", type=int, default=10_000_000)
    ap.add_argument("--names", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TREB_HOME"] = str(Path(tmp) / "home")
        from trebuchet.store import metrics
        from trebuchet.store.db import RunRecord, Store
        from trebuchet.store.paths import db_path

        (Path(tmp) / "home").mkdir()
        run_dir = Path(tmp) / "run"
        f = run_dir / "attempt-0" / "metrics" / "rank-0.jsonl"
        f.parent.mkdir(parents=True)
        steps = a.values // a.names
        names = [f"metric_{i}" for i in range(a.names)]
        t0 = time.perf_counter()
        half = steps // 2
        with open(f, "w") as fh:
            for s in range(half):
                m = {n: 1.0 / (s + 1 + i) for i, n in enumerate(names)}
                fh.write(json.dumps({"t": 1e9 + s * 0.01, "s": s, "m": m}) + "\n")
        store = Store()
        rec = RunRecord(id="bench", name="bench", backend="local", launcher="native",
                        state="RUNNING", nodes=1, procs_per_node=1, run_dir=str(run_dir),
                        created_at=time.time())  # fmt: skip
        store.insert_run(rec)
        gen = time.perf_counter() - t0
        t1 = time.perf_counter()
        n1 = metrics.ingest(store, rec)
        first = time.perf_counter() - t1
        with open(f, "a") as fh:
            for s in range(half, steps):
                m = {n: 1.0 / (s + 1 + i) for i, n in enumerate(names)}
                fh.write(json.dumps({"t": 1e9 + s * 0.01, "s": s, "m": m}) + "\n")
        t2 = time.perf_counter()
        n2 = metrics.ingest(store, rec)
        second = time.perf_counter() - t2
        rows = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
        t3 = time.perf_counter()
        data = store.metrics("bench")
        read = time.perf_counter() - t3
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = os.path.getsize(db_path())
        print(
            f"values ingested: {n1 + n2:,} ({a.names} names x {steps:,} steps); "
            f"file {f.stat().st_size / 1e6:.0f} MB (generated in {gen:.0f} s)"
        )
        print(
            f"ingest: {first:.1f} s + {second:.1f} s ({(n1 + n2) / (first + second) / 1e6:.2f} "
            f"M values/s)"
        )
        print(
            f"rows kept: {rows:,} (at most {metrics.MAX_POINTS} a series); "
            f"store size {size / 1e6:.2f} MB"
        )
        print(
            f"Store.metrics(run): {sum(map(len, data.values())):,} points in {read * 1e3:.0f} ms;"
            f" last loss step {data[names[0]][-1][0]:.0f}"
        )


if __name__ == "__main__":
    main()
