"""`treb ps`: the runs of this user, newest first."""

from __future__ import annotations

import argparse
import json

from trebuchet.backends import refresh
from trebuchet.cli.common import STATE_STYLE, age
from trebuchet.spec.duration import human
from trebuchet.store.db import Store

RECENT = 20


def main(args: argparse.Namespace) -> int:
    store = Store()
    refresh(store, store.list(active_only=True))
    if args.sweep:
        runs = store.sweep_runs(args.sweep)
    else:
        runs = store.list() if args.all else store.list(limit=RECENT)
    if not args.all and not args.sweep:  # active runs always show, however old
        seen = {r.id for r in runs}
        runs += [r for r in store.list(active_only=True) if r.id not in seen]
    if args.json:
        print(json.dumps([r.to_json() for r in runs], indent=2))
        return 0
    if not runs:
        print("no runs yet (start one with `treb run SPEC`)")
        return 0
    from trebuchet.cli.table import print_table

    rows = [
        [r.id, r.name, r.backend, r.state, f"{r.nodes}x{r.procs_per_node}",
         f"{r.attempt + 1}/{r.max_attempts}", age(r.created_at), human(r.duration)]
        for r in runs
    ]  # fmt: skip
    headers = ["ID", "NAME", "BACKEND", "STATE", "SHAPE", "ATTEMPT", "AGE", "DURATION"]
    if any(r.sweep_id for r in runs):  # the sweep and the point's parameters
        headers += ["SWEEP", "PARAMS"]
        for row, r in zip(rows, runs, strict=True):
            params = " ".join(f"{k}={v}" for k, v in json.loads(r.params or "{}").items())
            row += [r.sweep_id or "-", params or "-"]
    print_table(headers, rows, [STATE_STYLE.get(r.state) for r in runs])
    return 0
