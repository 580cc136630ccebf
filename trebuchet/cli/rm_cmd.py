"""`treb rm RUN...`: remove runs (directory and index rows); active ones only with
--force, which cancels them first."""

from __future__ import annotations

import argparse
import time

from trebuchet.cli.common import runs_named
from trebuchet.errors import UserError
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.remove import remove_run, size_text


def stop(store: Store, rec: RunRecord) -> RunRecord:
    """Cancel an active run and wait until nothing of it writes into its directory."""
    from trebuchet.backends import get_backend
    from trebuchet.runtime.process.procs import alive

    get_backend(rec.backend).cancel(store, rec)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = store.get(rec.id) or rec
        if not now.active and not alive(now.supervisor_pid, now.supervisor_start):
            return now
        time.sleep(0.05)
    raise UserError(f"run {rec.id} is still {now.state} after the cancel; nothing removed")


def remove(store: Store, runs: list[RunRecord], dry_run: bool = False) -> int:
    from trebuchet.store.remove import disk_used, run_path

    total = 0
    for rec in runs:
        size = disk_used(run_path(rec.id)) if dry_run else remove_run(store, rec.id)
        total += size
        verb = "would remove" if dry_run else "removed"
        print(f"{verb} {rec.id}  {rec.name}  {rec.state}  {size_text(size)}")
    word = "would free" if dry_run else "freed"
    print(f"{len(runs)} run(s), {word} {size_text(total)}")
    return 0


def main(args: argparse.Namespace) -> int:
    from trebuchet.runner import refresh

    if not all(ref.strip() for ref in args.runs):  # resolve('') would mean the latest run
        raise UserError("treb rm '': give a run id, prefix, name or sweep id")
    store = Store()
    runs = runs_named(store, args.runs)
    refresh(store, [r for r in runs if r.active])  # a vanished supervisor: LOST, removable
    runs = [store.get(r.id) or r for r in runs]
    active = [r for r in runs if r.active]
    if active and not args.force:
        names = ", ".join(f"{r.id} ({r.state})" for r in active)
        raise UserError(f"{names}: still active; `treb cancel` it first, or rm --force "
                        "cancels then removes")  # fmt: skip
    runs = [stop(store, r) if r.active else r for r in runs]
    return remove(store, runs)
