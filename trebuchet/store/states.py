"""Run states and what counts as finished."""

from __future__ import annotations

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

# `treb run` exit codes by final state (contract: 0 ok, 1 failed or timeout, 130 interrupted).
EXIT_CODES = {SUCCEEDED: 0, FAILED: 1, TIMEOUT: 1, LOST: 1, CANCELLED: 130}
