"""The one writer of a run's state: every change of it is an event in the run's own
events.jsonl first, then the index follows that event, by the same rule a rebuilt index
(store/rebuild.py) replays it with. So the index never knows a state its run directory
does not (tests/fast/test_state_writer.py keeps this the only writer).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from trebuchet.runtime.contracts import schema as contracts
from trebuchet.runtime.process.procs import hostname, start_time
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event, refused_submission
from trebuchet.store.states import FAILED, LOST, RETRYING, RUNNING, TERMINAL


def columns(ev: dict[str, Any]) -> dict[str, Any]:
    """The run columns an event sets (live and in a rebuild); {} for an event that leaves
    the state alone. `state` moves only as contracts.allowed says (the caller checks)."""
    kind, when = ev.get("event"), ev.get("time")
    out: dict[str, Any] = {}
    if kind == "run_started":
        out = {"state": RUNNING, "started_at": when, "supervisor_pid": ev.get("pid"),
               "supervisor_start": ev.get("start"), "host": ev.get("host")}  # fmt: skip
    elif kind == "attempt_started":
        out = {"state": RUNNING, "attempt": ev.get("attempt")}
    elif kind == "retrying":
        out = {"state": RETRYING}
    elif kind in ("run_ended", "lost", "failed", "state", "environment_failed") or (
        refused_submission(ev) is not None
    ):
        state = ev.get("state") or {"lost": LOST, "state": None}.get(str(kind), FAILED)
        out = {"state": str(state)} if state else {}
        if state in TERMINAL:
            out["ended_at"] = when
        if kind == "state" and ev.get("started_at"):  # an engine took the job (SkyPilot, k8s)
            out["started_at"] = ev["started_at"]
    return {k: v for k, v in out.items() if v is not None or k == "ended_at"}


def record(
    store: Store,
    run_id: str,
    event: str,
    index: dict[str, Any] | None = None,
    only_if_active: bool = True,
    reason: str | None = None,
    known: RunRecord | None = None,
    **fields: Any,
) -> bool:
    """A run's state changes: `event` goes into its events.jsonl, then the index takes the
    columns it sets (and `index`: other columns of the same change) when the move is
    allowed. `known`: the run as the caller just read it (a refresh of many runs saves a
    read each; the index's own guard still refuses a move a newer state forbids)."""
    when = fields.pop("time", None) or time.time()
    if reason:
        fields["reason"] = reason
    ev = {"time": when, "event": event, **fields}
    cols = {**columns(ev), **(index or {})}
    state = cols.get("state")
    if state is None:
        raise ValueError(f"event {event!r} sets no state: write it with store.files.append_event")
    rec = known if known is not None else store.get(run_id)
    if rec is None:
        return False
    if event == "state" and rec.state == state:  # an engine says again what it said: no event
        rest = {k: v for k, v in cols.items() if k != "state" and getattr(rec, k, None) != v}
        return bool(rest) and store.write_state(run_id, only_if_active, **rest)
    if not contracts.allowed(rec.state, state) or (only_if_active and not rec.active):
        return False
    try:
        kept = append_event(Path(rec.run_dir), event, **{**fields, "time": when})
        why = "" if kept else "the run directory is gone"
    except OSError as exc:  # a full disk: the index still learns it; say what a rebuild lacks
        why = str(exc)
    if why:
        print(f"treb: run {run_id}: event {event} not in events.jsonl: {why}", file=sys.stderr)
    return store.write_state(run_id, only_if_active=only_if_active, **cols)


def ended(
    store: Store,
    run_id: str,
    state: str,
    reason: str | None = None,
    event: str = "run_ended",
    attempt: int | None = None,
    when: float | None = None,
    **index: Any,
) -> bool:
    """The run ended as a verb or its engine says, attempt `attempt` closed with it when
    given (a rank's own end is in its records)."""
    when = when or time.time()
    done = record(store, run_id, event, index, reason=reason, time=when, state=state)
    if done and attempt is not None:
        store.set_attempt(run_id, attempt, state=state, ended_at=when, reason=reason)
    return done


def follow(store: Store, run_id: str, state: str, reason: str | None = None) -> None:
    """A state an engine reported for a run it runs alone (one attempt, as far as
    trebuchet sees): an end also closes attempt 0 with its reason."""
    if state in TERMINAL:
        ended(store, run_id, state, reason, event="state", attempt=0)
    else:
        record(store, run_id, "state", reason=reason, state=state)


def run_started(store: Store, run_id: str, **facts: Any) -> None:
    """RUNNING, supervised by this process (pid, start time and host: a rebuilt index then
    knows the supervisor as the live one did, so a reused pid is never taken for it)."""
    me = os.getpid()
    now = time.time()
    record(store, run_id, "run_started", {"last_seen": now}, False, time=now, pid=me,
           start=start_time(me), host=hostname(), **facts)  # fmt: skip
