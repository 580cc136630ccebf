"""Retry by cause: the spec's `no_retry_exit_codes` and `retry_exit_codes` (SkyPilot's
recover_on_exit_codes, NVRx's "do not requeue" code), applied before the log policies.

A program knows when another attempt cannot help and says so with its exit status, cheaper
than a log pattern. The rules can only end a run, never grant attempts, and only a
process's own exit counts: a lost node, a preemption, a hang or a timeout is no answer.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from ..rundir.records import attempt_records, claimed_first, first_failure, read_json

PREEMPTED = "preempted"  # by runtime/node/fault.py; no .json name: not an outcome record

if TYPE_CHECKING:
    from ..contracts.schema import FirstFailure

NOT_A_PROGRAM = ("node_lost", "node_unhealthy")  # causes without a program's exit status
NO_RETRY = "no_retry_exit_codes"
ONLY_RETRY = "retry_exit_codes"
# The shell's "cannot start" statuses: the next attempt runs the same command on the same
# PATH, so it cannot start either (unless retry_exit_codes names it: a `pre` hook repairs).
CANNOT_START = {126: "not executable", 127: "command not found"}
CANNOT_START_RULE = "command_cannot_start"


def verdict(
    code: int | None, no_retry: Sequence[int], only: Sequence[int] | None
) -> tuple[str, str] | None:
    """(rule, why) when the rules end the run after exit code `code`, else None."""
    if code is None:
        return None
    if code in no_retry:
        return NO_RETRY, f"exit code {code} is in no_retry_exit_codes"
    if code in CANNOT_START and (only is None or code not in only):
        return CANNOT_START_RULE, (
            f"exit code {code} ({CANNOT_START[code]}): the command cannot start, so another "
            f"attempt would not either; not retried (retry_exit_codes: [{code}] retries it)"
        )
    if only is not None and code not in only:
        codes = ", ".join(map(str, only)) or "none"
        return ONLY_RETRY, f"exit code {code} is not in retry_exit_codes ({codes})"
    return None


def cause_code(cause: FirstFailure | None, adir: str) -> int | None:
    """The first failure's exit code (else the one on record in `adir`); None when it is no
    program's exit: a lost or unhealthy node, an end after a preemption began, or the rank
    that left first (records.left_first: its code is the launcher's SIGTERM, its own lost)."""
    if cause is None:
        cause = claimed_first(adir) or first_failure(attempt_records(adir))
    if not cause or cause.get("label") in NOT_A_PROGRAM or cause.get("left_first"):
        return None
    if preempted(cause, adir):
        return None
    code = cause.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def preempted(cause: FirstFailure, adir: str) -> bool:
    mark = read_json(os.path.join(adir, PREEMPTED))
    began = mark.get("time") if isinstance(mark, dict) else None
    ended = cause.get("ended_at")
    if not isinstance(began, (int, float)) or isinstance(began, bool):
        return False
    return not isinstance(ended, (int, float)) or ended >= began
