"""Helpers shared by the verbs: formatting. (Refreshing active runs is
runner.refresh; describing a failure, store.states.describe_failure: the API uses them.)"""

from __future__ import annotations

import time
from typing import Any


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


def state_cell(rec: Any) -> str:
    """A RunRecord's state, with the engine's reason while it waits (`PENDING (Priority)`)."""
    if rec.active and rec.waiting:
        return f"{rec.state} ({str(rec.waiting.get('reason', '')).split(',')[0]})"
    return str(rec.state)


STATE_STYLE = {
    "SUCCEEDED": "green", "FAILED": "red", "TIMEOUT": "red", "LOST": "magenta",
    "CANCELLED": "yellow", "RUNNING": "cyan", "RETRYING": "cyan", "PENDING": "blue",
}  # fmt: skip
