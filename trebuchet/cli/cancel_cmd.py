"""`treb cancel`: stop a run on whatever engine runs it."""

from __future__ import annotations

import argparse

from trebuchet.backends import get_backend
from trebuchet.store.db import Store


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
    rec = store.resolve(args.run)
    if not rec.active:
        print(f"run {rec.id} already ended: {rec.state}")
        return 0
    get_backend(rec.backend).cancel(store, rec)
    rec = store.get(rec.id) or rec
    print(f"run {rec.id} {rec.state}")
    return 0
