"""Goodput: where a run's wall time went (queued, environment, startup, training kept,
work redone, restarts, hangs, node loss, teardown) and its effective training time ratio
(ETTR), from what treb records (docs/goodput.md). account.py is the accounting (pure),
timeline.py reads a run's records into its input; `of_run` joins them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trebuchet.goodput.account import Goodput, account, line, total

__all__ = ["Goodput", "account", "line", "of_run", "total"]


def of_run(rec: Any, now: float | None = None) -> Goodput:
    """The goodput of one run (a store RunRecord: its id, name, state and run_dir)."""
    from trebuchet.goodput.timeline import load
    from trebuchet.store.files import read_events

    run_dir = Path(rec.run_dir)
    tl = load(run_dir, rec.id, read_events(run_dir))
    tl.name = rec.name
    if rec.state not in ("PENDING", "RUNNING", "RETRYING"):
        tl.state = rec.state
        if tl.ended is None:  # ended without a run_ended record (LOST, an old run)
            tl.ended = rec.ended_at
    else:
        tl.state, tl.ended = rec.state, None
    return account(tl, time.time() if now is None else now)
