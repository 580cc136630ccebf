"""`treb metrics`: a run's metrics, read into the store from what the node agents wrote;
names are shown as text, whatever a rank printed. The first word may be a metric's name."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from typing import Any

from trebuchet.results.perfcsv import cell
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.store.db import RunRecord, Store

BLOCKS = "▁▂▃▄▅▆▇█"
WIDTH = 32


def main(args: argparse.Namespace) -> int:
    from trebuchet.runner import refresh
    from trebuchet.store import metrics

    store = Store()
    names = args.names or None
    if args.run and not store.matches_run(args.run):  # `treb metrics loss`: the latest run's
        names = [args.run, *args.names]
        args.run = None
    rec = store.resolve(args.run)
    refresh(store, [rec])
    rec = store.get(rec.id) or rec
    metrics.ingest(store, rec)
    data = store.metrics(rec.id, names, args.rank)
    last = metrics.latest(store, rec.id, args.rank)
    dropped = metrics.dropped(store, rec.id)
    if names:
        missing = [n for n in names if n not in data]
        if missing:
            known = ", ".join(sorted(last)) or "none yet"
            print(shown(f"treb: run {rec.id} has no metric {', '.join(missing)} (has: {known})"),
                  file=sys.stderr)  # fmt: skip
            if not data:
                return 1
    if args.json:
        print(json.dumps({**as_json(rec, data, last), "dropped": dropped}, indent=2))
        return 0
    if args.csv:
        write_csv(rec, data)
        return 0
    for line in metrics.dropped_lines(dropped):  # said once, before what was kept
        print(f"treb: run {rec.id}: {line}", file=sys.stderr)
    if not data:
        print(shown(f"run {rec.id} ({rec.name}, {rec.state}): no metrics yet (docs/metrics.md)"))
        return 0
    show(rec, data, last)
    return 0


def as_json(rec: RunRecord, data: dict[str, list], last: dict[str, dict]) -> dict[str, Any]:
    return {
        "run_id": rec.id,
        "name": rec.name,
        "state": rec.state,
        "metrics": {
            name: {
                "last": {k: last[name][k] for k in ("step", "value", "time")}
                if name in last
                else None,
                "count": last.get(name, {}).get("points"),
                "points": [list(p) for p in pts],
            }
            for name, pts in data.items()
        },
    }


def write_csv(rec: RunRecord, data: dict[str, list]) -> None:
    out = csv.writer(sys.stdout)
    out.writerow(["run_id", "name", "step", "value", "time"])
    for name, pts in data.items():
        for step, value, t in pts:
            row = [rec.id, shown(name), number(step), repr(value), f"{t:.3f}"]
            out.writerow([cell(c) for c in row])  # a name as =HYPERLINK(..) is no formula


def number(v: float) -> str:
    """A value as short as it stays exact enough to read: 0.1234, 1.2e-05, 1200."""
    if not math.isfinite(v):  # never stored now; an older index may hold one
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.6g}"


def sparkline(values: list[float], width: int = WIDTH) -> str:
    """The values in at most `width` characters (each the mean of its slice)."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return ""
    if len(values) > width:
        n = len(values)
        cuts = [round(i * n / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    lo, hi = min(values), max(values)
    if hi == lo:
        return BLOCKS[3] * len(values)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((v - lo) / (hi - lo) * top)] for v in values)


def show(rec: RunRecord, data: dict[str, list], last: dict[str, dict]) -> None:
    from trebuchet.cli.table import print_table

    print(shown(f"run {rec.id} ({rec.name}, {rec.state})"))
    rows = []
    for name, pts in data.items():
        values = [v for _, v, _ in pts]
        step, value, _ = pts[-1]
        count = last.get(name, {}).get("points", len(pts))
        span = f"{number(min(values))}..{number(max(values))}"
        rows.append([name, number(value), number(step), str(count), span, sparkline(values)])
    print_table(["METRIC", "LAST", "STEP", "POINTS", "RANGE", "HISTORY"], rows)
