"""Helpers shared by the verbs: opening the store, refreshing active runs, formatting."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from trebuchet.store.db import RunRecord, Store


def refresh(store: Store, runs: list[RunRecord]) -> None:
    """Let each engine update its active runs, in one batch per engine."""
    by_backend: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in runs:
        if rec.active:
            by_backend[rec.backend].append(rec)
    if not by_backend:
        return
    from trebuchet.backends import get_backend

    for name, recs in by_backend.items():
        get_backend(name).refresh(store, recs)


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


STATE_STYLE = {
    "SUCCEEDED": "green", "FAILED": "red", "TIMEOUT": "red", "LOST": "magenta",
    "CANCELLED": "yellow", "RUNNING": "cyan", "RETRYING": "cyan", "PENDING": "blue",
}  # fmt: skip


def describe_failure(ff: dict | None) -> str:
    """'rank 1 (node 0, local 1) exited with code 3' and the like."""
    if not ff:
        return "-"
    label = str(ff.get("label") or "")
    if label == "environment":
        return f"the environment build failed: {ff.get('message', '')}".rstrip(": ")
    if ff.get("rank") is not None:
        who = f"rank {ff['rank']} (node {ff['node']}, local rank {ff['local_rank']})"
    elif label.startswith(("pre:", "post:")):
        who = f"the {label.split(':')[0]} command on node {ff['node']}"
    else:
        who = f"node {ff['node']} process"
    if ff.get("host"):  # engines with real nodes (slurm) record where the process ran
        who += f" on {ff['host']}"
    how = (
        f"was killed by {ff['signal']}"
        if ff.get("signal")
        else f"exited with code {ff.get('exit_code')}"
    )
    when = time.strftime("%H:%M:%S", time.localtime(ff["ended_at"])) if ff.get("ended_at") else "?"
    return f"{who} {how} at {when} (attempt {ff.get('attempt', 0)})"
