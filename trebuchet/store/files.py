"""Run-directory files that are never half-written: write a temp file, then rename."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trebuchet.runtime.rundir import records, regular


def write_atomic(path: Path, text: str, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` with `text` in one rename, so readers see old or new, never half.
    `durable=False`: the caller makes it durable with others (records.sync)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_text(str(path), text, mode, durable)


def write_atomic_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_bytes(str(path), data, mode)


def write_json(path: Path, data: Any, durable: bool = True) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", durable=durable)


def read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it does not exist (yet)."""
    try:
        return json.loads(regular.read_text(path))  # a rank's FIFO there never blocks
    except (FileNotFoundError, regular.NotRegular):
        return None


def append_event(run_dir: Path, event: str, **fields: Any) -> bool:
    """One line per event in events.jsonl; a single O_APPEND write keeps lines whole.
    False when the run directory is gone (deleted by hand): the store still has the run."""
    try:
        records.append_event(str(run_dir), event, **fields)
    except FileNotFoundError:
        return False
    return True


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's events; a line that is no JSON object (a rank can reach the file) is
    skipped, and a FIFO there is not read."""
    try:
        text = regular.read_text(run_dir / "events.jsonl")
    except (FileNotFoundError, regular.NotRegular):
        return []
    out = []
    for line in text.splitlines():
        try:
            event = json.loads(line) if line.strip() else None
        except (ValueError, RecursionError):  # no JSON, or nested past the recursion limit
            continue
        if isinstance(event, dict):
            out.append(event)
    return out


def refused_submission(event: dict[str, Any]) -> str | None:
    """The reason of an event saying the engine refused the run's submission: `<name>_failed`
    with a `reason` (`environment_failed` and `tracking_failed` carry an `error` instead)."""
    kind = str(event.get("event") or "")
    if kind.endswith("_failed") and event.get("reason") is not None:
        return str(event["reason"])
    return None
