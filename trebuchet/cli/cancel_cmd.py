"""`treb cancel`: stop a run on whatever engine runs it."""

from __future__ import annotations

import argparse
import time

from trebuchet.backends import get_backend
from trebuchet.store.db import Store


def main(args: argparse.Namespace) -> int:
    store = Store()
    members = [] if store.matches_run(args.run) else store.sweep_runs(args.run)
    if members:  # pending local points are cancelled first, so the driver starts no more
        for r in members:
            if r.backend == "local" and r.state == "PENDING" and not r.supervisor_pid:
                store.update_run(r.id, only_if_active=True, state="CANCELLED", ended_at=time.time())
        active = [f for f in (store.get(r.id) for r in members) if f and f.active]
        for name in dict.fromkeys(r.backend for r in active):
            backend = get_backend(name)
            mine = [r for r in active if r.backend == name]
            if hasattr(backend, "cancel_sweep"):  # slurm: one scancel for the job array
                backend.cancel_sweep(store, mine)
                continue
            for r in mine:
                fresh = store.get(r.id)
                if fresh and fresh.active:
                    backend.cancel(store, fresh)
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
