"""Run states and what counts as finished."""

from __future__ import annotations

from typing import Any

PENDING = "PENDING"
RUNNING = "RUNNING"
RETRYING = "RETRYING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
TIMEOUT = "TIMEOUT"
CANCELLED = "CANCELLED"
LOST = "LOST"

ACTIVE = frozenset({PENDING, RUNNING, RETRYING})
TERMINAL = frozenset({SUCCEEDED, FAILED, TIMEOUT, CANCELLED, LOST})


def first_failure(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest non-zero outcome that was not a cascade (a process stopped by its
    launcher, the teardown or the engine); a rank's record before a node agent's."""
    failed = [
        r for r in records
        if r.get("exit_code") not in (None, 0) and not r.get("stopped_by_launcher")
    ]  # fmt: skip
    if not failed:
        return None
    return min(failed, key=lambda r: (r.get("rank") is None, r.get("ended_at") or 0.0))


# `treb run` exit codes by final state (contract: 0 ok, 1 failed or timeout, 130 interrupted).
EXIT_CODES = {SUCCEEDED: 0, FAILED: 1, TIMEOUT: 1, LOST: 1, CANCELLED: 130}
