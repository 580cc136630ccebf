"""Run states, what counts as finished, and how a failure reads."""

from __future__ import annotations

import time

from trebuchet.runtime.contracts import schema as contracts
from trebuchet.runtime.contracts.schema import FirstFailure
from trebuchet.runtime.rundir.records import (
    first_failure,  # noqa: F401 (one definition, shared)
    left_first_how,
)

PENDING = "PENDING"
RUNNING = "RUNNING"
RETRYING = "RETRYING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
TIMEOUT = "TIMEOUT"
CANCELLED = "CANCELLED"
LOST = "LOST"

# which are active and which final, and the moves between them: runtime/contracts/schema.py
ACTIVE = frozenset(contracts.ACTIVE)
TERMINAL = frozenset(contracts.TERMINAL)


# `treb run` exit codes by final state (contract: 0 ok, 1 failed or timeout, 130 interrupted).
EXIT_CODES = {SUCCEEDED: 0, FAILED: 1, TIMEOUT: 1, LOST: 1, CANCELLED: 130}


def describe_failure(ff: FirstFailure | None) -> str:
    """'rank 1 (node 0, local 1) exited with code 3' and the like."""
    if not ff:
        return "-"
    label = str(ff.get("label") or "")
    if label == "environment":
        return f"the environment build failed: {ff.get('message', '')}".rstrip(": ")
    if label == "disk":  # the supervisor could not write the run's records
        return f"the run was stopped: {ff.get('message')}"
    if label in ("node_lost", "node_unhealthy"):  # silent agents; failed health checks
        return f"{ff.get('message')} (attempt {int(ff.get('attempt') or 0) + 1})"
    if label == "setup":  # a node's setup failed before any rank started
        return f"{ff.get('message') or 'the setup failed'} (no rank started)"
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
    if ff.get("left_first"):  # rundir/records.left_first
        how = left_first_how(ff)
    when = time.strftime("%H:%M:%S", time.localtime(ff["ended_at"])) if ff.get("ended_at") else "?"
    return f"{who} {how} at {when} (attempt {int(ff.get('attempt') or 0) + 1})"


def describe_waiting(waiting: dict | None) -> str:
    """Why an active run has not started, as its engine says (RunRecord.waiting): the
    meaning, then the engine's own word for it (Slurm's pending reason)."""
    if not waiting:
        return ""
    return f"{waiting.get('meaning')} ({waiting.get('source', 'engine')}: {waiting.get('reason')})"
