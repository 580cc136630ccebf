"""Helpers shared by the verbs: formatting, the runs named. (Refreshing active runs is
runner.refresh; describing a failure, store.states.describe_failure: the API uses them.)"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trebuchet.store.db import RunRecord, Store


def console() -> Any:
    """A rich console; when output is not a terminal, wide enough never to truncate."""
    import sys

    from rich.console import Console

    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=400, no_color=True)


def age(ts: float | None) -> str:
    from trebuchet.spec.duration import human

    return "-" if ts is None else human(time.time() - ts)


def clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def runs_named(store: Store, refs: list[str]) -> list[RunRecord]:
    """The runs named (ids, prefixes, names; a sweep id: all its points), each once, in order."""
    out: dict[str, RunRecord] = {}
    for ref in refs:
        members = [] if store.matches_run(ref) else store.sweep_runs(ref)
        for rec in members or [store.resolve(ref)]:
            out.setdefault(rec.id, rec)
    return list(out.values())


def state_cell(rec: Any) -> str:
    """A RunRecord's state, with the engine's reason while it waits (`PENDING (Priority)`)."""
    if rec.active and rec.waiting:
        return f"{rec.state} ({str(rec.waiting.get('reason', '')).split(',')[0]})"
    return str(rec.state)


STATE_STYLE = {
    "SUCCEEDED": "green", "FAILED": "red", "TIMEOUT": "red", "LOST": "magenta",
    "CANCELLED": "yellow", "RUNNING": "cyan", "RETRYING": "cyan", "PENDING": "blue",
}  # fmt: skip
