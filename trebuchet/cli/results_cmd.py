"""`treb results`: performance rows of finished runs (docs/results.md), each row's change
against the one above of the same workload, metric and shape: a change of shape is no
change of the code."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RECENT = 20


def main(args: argparse.Namespace) -> int:
    from trebuchet.cli.common import runs_named
    from trebuchet.results import collect, perfcsv
    from trebuchet.runner import refresh
    from trebuchet.store.db import Store

    store = Store()
    if args.runs:  # a sweep id: all its points, side by side
        recs = runs_named(store, args.runs)
    else:
        recs = list(reversed(store.list() if args.all else store.list(limit=RECENT)))
    refresh(store, recs)
    rows: list[dict] = []
    waiting = []
    for rec in recs:
        rec = store.get(rec.id) or rec
        got = collect.collect(store, rec)
        for row in got:  # a sweep point's parameters travel with its rows
            row["sweep_id"], row["params"] = rec.sweep_id, json.loads(rec.params or "{}")
        if not got:
            waiting.append(f"{rec.id} ({rec.state})")
        rows += got
    if args.metric:  # the last value of each asked-for metric, beside each run's rows
        from trebuchet.store.metrics import ingest, latest

        for rec in recs:
            ingest(store, rec)
            last = latest(store, rec.id)
            values = {m: last[m]["value"] if m in last else None for m in args.metric}
            for row in rows:
                if row["run_id"] == rec.id:
                    row["metrics"] = values
    changes = perfcsv.relative_changes(rows)
    for row, change in zip(rows, changes, strict=True):
        row["relative_change"] = change
    if waiting:
        print(f"treb: no results yet for {', '.join(waiting)}", file=sys.stderr)
    if args.csv:
        n = perfcsv.write(rows, Path(args.csv))
        print(f"treb: wrote {n} row(s) to {args.csv}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        if not waiting:
            print("no finished runs yet (start one with `treb run SPEC`)")
        return 0
    if not args.csv or sys.stdout.isatty():
        show(rows, args.metric or [])
    workloads = {r["workload"] for r in rows}
    shapes = [next((perfcsv.shape(r) for r in rows if r["run_id"] == rec.id), None)
              for rec in recs]  # fmt: skip
    if args.runs and len(recs) == 2 and shapes[0] != shapes[1]:
        print(f"no change computed: {recs[0].id} ran {shapes[0]}, {recs[1].id} ran "
              f"{shapes[1]}; only runs of the same shape (nodes x processes per node) "
              "are compared")  # fmt: skip
        return 0
    if args.runs and len(recs) == 2 and len(workloads) == 1 and len(rows) >= 2:
        last = rows[-1]
        if last.get("relative_change") is not None:
            print(f"change: {last['relative_change']:+.2f}% {last['metric']} "
                  f"({recs[1].id} vs {recs[0].id})")  # fmt: skip
    if args.runs and len(recs) == 2:
        for m in args.metric or []:
            before, after = (metric_of(rows, r.id, m) for r in recs)
            if before and after is not None:
                change = (after - before) / abs(before) * 100.0
                print(f"change: {change:+.2f}% {m} ({recs[1].id} vs {recs[0].id})")
    return 0


def metric_of(rows: list[dict], run_id: str, name: str) -> float | None:
    return next((r["metrics"][name] for r in rows if r["run_id"] == run_id and "metrics" in r),
                None)  # fmt: skip


def show(rows: list[dict], metrics: list[str]) -> None:
    from trebuchet.cli.table import print_table
    from trebuchet.results.perfcsv import number
    from trebuchet.spec.duration import human

    def cell(row: dict) -> list[str]:
        change = row.get("relative_change")
        return [
            row["run_id"], row["model"], row["status"], number(row.get("performance")) or "-",
            row.get("metric") or "-", "-" if change is None else f"{change:+.2f}%",
            f"{row.get('nnodes')}x{row.get('procs_per_node')}", row.get("launcher") or "-",
            (row.get("git_commit") or "-")[:10], human(row.get("test_duration")),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created_at"]))
            if row.get("created_at") else "-",
        ]  # fmt: skip

    headers = ["RUN", "MODEL", "STATUS", "PERFORMANCE", "METRIC", "CHANGE", "SHAPE",
               "LAUNCHER", "COMMIT", "DURATION", "CREATED"]  # fmt: skip
    cells = [cell(r) for r in rows]
    for m in metrics:  # --metric: the run's last value of it
        headers.append(m.upper())
        for c, r in zip(cells, rows, strict=True):
            c.append(number((r.get("metrics") or {}).get(m)) or "-")
    keys = sorted({k for r in rows for k in r.get("params") or {}})
    if keys:  # sweep points: their parameters side by side
        headers += keys
        for c, r in zip(cells, rows, strict=True):
            c += [str((r.get("params") or {}).get(k, "-")) for k in keys]
    print_table(headers, cells)
