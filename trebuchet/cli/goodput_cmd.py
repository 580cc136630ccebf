"""`treb goodput`: where the runs' wall time went and their effective training time ratio
(docs/goodput.md); a row per run, per cause or per node."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from trebuchet.goodput import Goodput, of_run, total
from trebuchet.goodput.account import LOST_CAUSES, PRODUCTIVE, WORDS, largest, short
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.store.db import RunFilter, RunRecord, Store


def _runs(store: Store, args: argparse.Namespace) -> list[RunRecord]:
    if args.runs:
        return [store.resolve(ref) for ref in args.runs]
    if args.since:
        from trebuchet.cli.filters import parse_when

        return store.list(where=RunFilter(since=parse_when(args.since, "--since")))
    return [store.resolve(None)]


def main(args: argparse.Namespace) -> int:
    from trebuchet.runner import refresh

    store = Store()
    recs = _runs(store, args)
    refresh(store, recs)
    now = time.time()
    items = [of_run(store.get(r.id) or r, now) for r in recs]
    both = total(items)
    if args.json:
        out: dict[str, Any] = {"runs": [g.to_json() for g in items], "total": both.to_json()}
        print(json.dumps(out, indent=2))
        return 0
    if not items:
        print("no runs")
        return 0
    if args.by == "cause":
        show_causes(both)
    elif args.by == "node":
        show_nodes(both)
    else:
        show_runs(items)
    return 0


def _pct(g: Goodput) -> str:
    return f"{g.ettr * 100:5.1f} %" if g.wall_s > 0 else "    - "


def show_runs(items: list[Goodput]) -> None:
    print(f"{'RUN':<10} {'NAME':<20} {'STATE':<10} {'WALL':>7} {'ETTR':>7}  LOST")
    for g in items:
        where = ", ".join(f"{short(v)} {WORDS[c]}" for v, c in largest(g, 4)) or "-"
        if not g.marks:
            where += " (no steps seen)"
        print(shown(f"{g.run:<10} {g.name[:20]:<20} {g.state:<10} {short(g.wall_s):>7} "
                    f"{_pct(g):>7}  {where}"))  # fmt: skip


def show_causes(g: Goodput) -> None:
    print(f"{'CAUSE':<12} {'TIME':>8} {'SHARE':>7}")
    for c in (PRODUCTIVE, *LOST_CAUSES):
        v = g.seconds[c]
        share = v / g.wall_s * 100 if g.wall_s > 0 else 0.0
        print(f"{WORDS.get(c, 'training kept'):<12} {short(v):>8} {share:6.1f} %")
    print(f"{'wall':<12} {short(g.wall_s):>8} ETTR {_pct(g).strip()}")


def show_nodes(g: Goodput) -> None:
    if not g.by_node:
        print("no loss was caused by a node's failure")
        return
    print(f"{'NODE':<24} {'LOST':>8}")
    for node, v in sorted(g.by_node.items(), key=lambda kv: -kv[1]):
        print(shown(f"{node[:24]:<24} {short(v):>8}"))
