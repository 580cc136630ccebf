"""A run started with `--after`, waiting in its own supervisor (local and ssh engines):
detached like any run, so it survives the `treb run` that started it; it polls the run
index (store/after.py) until its dependencies ended as asked, then the supervisor goes on
as for any run, or records the run CANCELLED with the reason when one cannot. A dependency
run by another engine (a Slurm job) is brought up to date through `refresh`, the engines'
own word (handed down from cli/supervise.py: this layer may not import the engines).

`treb cancel` while it waits: the supervisor's SIGTERM ends the wait, and cancel records
CANCELLED as for a supervisor that ended without an outcome.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trebuchet.store import after, lifecycle
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event
from trebuchet.store.states import CANCELLED

POLL_S = 1.0  # a look at the index (one read per dependency)
REFRESH_S = 10.0  # the engines asked about the dependencies (a local one: is its supervisor alive)

Refresh = Callable[[Store, list[RunRecord]], None]


def wait(store: Store, run_id: str, run_dir: Path, refresh: Refresh | None = None) -> bool:
    """True once the run may start (at once without `after.json`); False when it was
    cancelled, now or meanwhile."""
    deps = after.read(run_dir)
    if not deps:
        return True
    asked = 0.0
    while True:
        rec = store.get(run_id)
        if rec is None or not rec.active:
            return False  # cancelled meanwhile
        ready, why = after.verdict(store, deps)
        if why:
            lifecycle.ended(store, run_id, CANCELLED, why, attempt=0, waiting=None)
            _notify(run_dir, why)
            return False
        if ready:
            store.update_run(run_id, waiting=None)
            append_event(run_dir, "dependencies_met", runs=[d["run"] for d in deps])
            return True
        if refresh is not None and time.monotonic() - asked >= REFRESH_S:
            asked = time.monotonic()
            others = [store.get(d["run"]) for d in deps]
            active = [r for r in others if r is not None and r.active]
            if active:
                refresh(store, active)
                continue
        time.sleep(POLL_S)


def _notify(run_dir: Path, why: str) -> None:
    """The spec's webhooks that asked for `cancelled` hear of it, as from a controller."""
    from trebuchet.runtime.job.life import notifier

    sender = notifier(str(run_dir))
    if sender is not None:
        sender.event("cancelled", CANCELLED, why)
        sender.close()
