"""`treb cancel`: stop a run on whatever engine runs it."""

from __future__ import annotations

import argparse

from trebuchet.backends import get_backend
from trebuchet.runner import refresh
from trebuchet.store.db import RunRecord, Store


def main(args: argparse.Namespace) -> int:
    store = Store()
    members = [] if store.matches_run(args.run) else store.sweep_runs(args.run)
    if members:  # each engine stops its points (Slurm: one scancel for the job array)
        print(cancel_sweep(store, members))
        return 0
    print(cancel_run(store, store.resolve(args.run)))
    return 0


def cancel_run(store: Store, rec: RunRecord) -> str:
    """Stop one run through its engine (`treb cancel`, the dashboard's button); what happened."""
    if not rec.active:
        return f"run {rec.id} already ended: {rec.state}"
    get_backend(rec.backend).cancel(store, rec)
    rec = store.get(rec.id) or rec
    return f"run {rec.id} {rec.state}"


def cancel_sweep(store: Store, members: list[RunRecord]) -> str:
    """Cancel a sweep's active points; what happened, naming those that had already ended."""
    refresh(store, members)  # the engines' word first: a point may have ended meanwhile
    fresh = [store.get(r.id) or r for r in members]
    active = [r for r in fresh if r.active]
    ended = [r for r in fresh if not r.active]
    for name in dict.fromkeys(r.backend for r in active):
        get_backend(name).cancel_sweep(store, [r for r in active if r.backend == name])
    sweep = members[0].sweep_id
    if not active:
        return f"sweep {sweep} already ended: {counts(ended)}"
    after = [store.get(r.id) or r for r in active]
    before = f"; {len(ended)} had already ended ({counts(ended)})" if ended else ""
    return f"sweep {sweep}: {len(active)} of {len(fresh)} runs stopped ({counts(after)}){before}"


def counts(runs: list[RunRecord]) -> str:
    """`3 SUCCEEDED, 1 FAILED`: how many runs are in each state."""
    states = [r.state for r in runs]
    return ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
