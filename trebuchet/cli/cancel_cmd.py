"""`treb cancel`: stop a run on whatever engine runs it."""

from __future__ import annotations

import argparse

from trebuchet.backends import get_backend
from trebuchet.store.db import RunRecord, Store


def main(args: argparse.Namespace) -> int:
    store = Store()
    members = [] if store.matches_run(args.run) else store.sweep_runs(args.run)
    if members:  # each engine stops its points (Slurm: one scancel for the job array)
        for name in dict.fromkeys(r.backend for r in members):
            fresh = (store.get(r.id) for r in members if r.backend == name)
            active = [f for f in fresh if f and f.active]
            if active:
                get_backend(name).cancel_sweep(store, active)
        print(f"sweep {members[0].sweep_id}: cancelled")
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
