"""`treb ps`: the runs of this user, newest first, filtered in the store's SQL."""

from __future__ import annotations

import argparse
import json

from trebuchet.cli.filters import parse_states, parse_when
from trebuchet.errors import UserError
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.store.db import RunFilter, Store

RECENT = 20


def run_filter(args: argparse.Namespace) -> RunFilter:
    if args.name_arg and args.name and args.name_arg != args.name:
        raise UserError(f"treb ps {args.name_arg} --name {args.name}: give the name once")
    return RunFilter(
        states=parse_states(args.state),
        name=args.name_arg or args.name,
        backend=args.backend,
        since=parse_when(args.since, "--since") if args.since else None,
    )


def main(args: argparse.Namespace) -> int:
    where = run_filter(args)
    store = Store()
    if not args.no_refresh:  # the engines' word on active runs, before filtering by state
        from trebuchet.runner import refresh

        refresh(store, store.list(active_only=True))
    if args.sweep:
        members = store.sweep_runs(args.sweep)  # the id prefix, resolved (or refused)
        where.sweep_id = members[0].sweep_id if members else "-"
        runs = store.list(where=where)[::-1]  # a sweep's points in order
    else:
        runs = store.list(where=where) if args.all else store.list(limit=RECENT, where=where)
    if not args.all and not args.sweep:  # active runs always show, however old
        seen = {r.id for r in runs}
        runs += [r for r in store.list(active_only=True, where=where) if r.id not in seen]
    if args.quiet:
        print("\n".join(r.id for r in runs))
        return 0
    from trebuchet.cli.progress import eta_text, progress_of, progress_text

    progress = {r.id: progress_of(r) for r in runs if r.active}  # the agents' records
    if args.json:
        print(json.dumps([{**r.to_json(), "progress": progress.get(r.id)} for r in runs],
                         indent=2))  # fmt: skip
        return 0
    if not runs:
        filtered = bool(where.states) or any(
            v is not None for v in (where.name, where.backend, where.since, where.sweep_id)
        )
        print("no runs match" if filtered else "no runs yet (start one with `treb run SPEC`)")
        return 0
    from trebuchet.cli.common import STATE_STYLE, age, state_cell
    from trebuchet.cli.table import print_table
    from trebuchet.spec.duration import human
    from trebuchet.store.states import describe_waiting

    rows = [
        [r.id, r.name, r.backend, state_cell(r), f"{r.nodes}x{r.procs_per_node}",
         f"{r.attempt + 1}/{r.max_attempts}", age(r.created_at), human(r.duration)]
        for r in runs
    ]  # fmt: skip
    headers = ["ID", "NAME", "BACKEND", "STATE", "SHAPE", "ATTEMPT", "AGE", "DURATION"]
    if any(progress.values()):  # a run that prints its progress (runtime/watch/eta.py)
        headers += ["PROGRESS", "ETA"]
        for row, r in zip(rows, runs, strict=True):
            row += [progress_text(progress.get(r.id)), eta_text(progress.get(r.id))]
    if any(r.sweep_id for r in runs):  # the sweep and the point's parameters
        from trebuchet.spec.sweep import point_text

        headers += ["SWEEP", "PARAMS"]
        for row, r in zip(rows, runs, strict=True):
            row += [r.sweep_id or "-", point_text(json.loads(r.params or "{}")) or "-"]
    print_table(headers, rows, [STATE_STYLE.get(r.state) for r in runs])
    blocked = [r for r in runs if r.active and r.waiting and r.waiting.get("starts") is False]
    for r in blocked:  # said plainly: cancelling it is the user's move
        print(shown(f"{r.id}: {describe_waiting(r.waiting)}; `treb cancel {r.id}` ends it"))
    return 0
