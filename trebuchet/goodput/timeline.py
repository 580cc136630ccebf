"""A run's timeline for the goodput accounting, from what treb records on every engine:
events.jsonl (submission, environment, attempts, hangs, lost nodes, the end), each
attempt's attempt.json and first-failure (Slurm's controller writes those rather than
events), result.json, the ranks' marks or metrics steps (runtime/watch/marks.py) and the
checkpoint folder's entries. Reads each file once; a record that is missing or malformed
leaves its part out, never an exception.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from trebuchet.goodput.account import Attempt, Timeline
from trebuchet.runtime.rundir.records import AFTER, FIRST, read_json
from trebuchet.runtime.watch import marks as rmarks


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and v >= 0 else None


def _int(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1_000_000 else None


def _attempt_of(attempts: dict[int, Attempt], event: dict[str, Any]) -> Attempt | None:
    n = _int(event.get("attempt"))
    return attempts.get(n) if n is not None else None


def from_events(run: str, events: list[dict[str, Any]]) -> Timeline:
    """The timeline that events.jsonl alone says (one pass)."""
    tl = Timeline(run=run, submitted=math.inf, ended=None)
    attempts: dict[int, Attempt] = {}
    for e in events:
        t, kind = _num(e.get("time")), e.get("event")
        if t is None or not isinstance(kind, str):
            continue
        tl.submitted = min(tl.submitted, t)
        if kind == "environment_ready":
            tl.environment_s += _num(e.get("seconds")) or 0.0
        elif kind == "attempt_started":
            n = _int(e.get("attempt"))
            if n is not None and n not in attempts:
                attempts[n] = Attempt(n=n, start=t, end=None)
        elif kind == "attempt_ended":
            a = _attempt_of(attempts, e)
            if a is not None:
                a.end, a.state = t, str(e.get("state") or "FAILED")
        elif kind in ("hang", "node_lost"):
            n = _int(e.get("attempt"))
            if n is not None:  # applied once the attempts are known (Slurm: attempt.json)
                tl.pending.setdefault(n, []).append(e)
        elif kind == "run_ended":
            tl.ended, tl.state = t, str(e.get("state") or "")
    tl.attempts = list(attempts.values())
    apply_pending(tl)
    return tl


def apply_pending(tl: Timeline) -> None:
    """The hang and node_lost events of the attempts now known, applied (and let go)."""
    for a in tl.attempts:
        for e in tl.pending.pop(a.n, ()):
            _apply(a, e)


def _apply(a: Attempt, e: dict[str, Any]) -> None:
    """A hang or node_lost event on its attempt: where the time went while it lasted."""
    t = _num(e.get("time"))
    if e.get("event") == "hang" and e.get("action") != "warn" and a.hang_acted is None:
        a.hang_from, a.hang_acted = _num(e.get("last_progress")), t
    elif e.get("event") == "node_lost" and not e.get(AFTER) and a.lost_detected is None:
        a.lost_from, a.lost_detected = _num(e.get("last_seen")), t
        a.node = str(e.get("host") or e.get("node") or "")[:200] or None


def _from_files(tl: Timeline, run_dir: Path) -> None:
    """What the attempts' own files add: Slurm's attempt.json and result.json (its
    controller writes no attempt events), every attempt's first failure and marks."""
    known = {a.n: a for a in tl.attempts}
    try:
        names = os.listdir(run_dir)
    except OSError:
        names = []
    for name in names:
        n = name[len("attempt-") :] if name.startswith("attempt-") else ""
        if not n.isdigit() or len(n) > 6:
            continue
        adir = run_dir / name
        a = known.get(int(n))
        rec = read_json(str(adir / "attempt.json"), 1 << 20)
        if a is None and isinstance(rec, dict) and _num(rec.get("started_at")) is not None:
            a = known[int(n)] = Attempt(n=int(n), start=float(rec["started_at"]), end=None)
        if a is None:
            continue
        if isinstance(rec, dict) and a.end is None and _num(rec.get("ended_at")) is not None:
            a.end, a.state = float(rec["ended_at"]), str(rec.get("state") or "FAILED")
        ff = read_json(str(adir / FIRST), 1 << 20)
        if isinstance(ff, dict) and not ff.get(AFTER):
            a.failed_at = _num(ff.get("ended_at"))
            if a.node is None:
                node = _int(ff.get("node"))
                where = ff.get("host") or (f"node-{node}" if node is not None else None)
                a.node = None if where is None else str(where)[:200]
        for m in rmarks.attempt_marks(str(adir)):  # a compute mark is a step's progress too
            (a.checkpoints if m.kind == rmarks.CHECKPOINT else a.steps).append(m.t)
    tl.attempts = list(known.values())
    result = read_json(str(run_dir / "result.json"), 1 << 20)
    if tl.ended is None and isinstance(result, dict) and result.get("source") == "batch":
        tl.ended, tl.state = _num(result.get("ended_at")), str(result.get("state") or "")


def _checkpoints(tl: Timeline, run_dir: Path) -> None:
    """The checkpoint folder's entries, each in the attempt whose window holds its mtime
    (the attempts that marked no checkpoint themselves)."""
    found = rmarks.folder_checkpoints(rmarks.checkpoint_folder(str(run_dir)))
    if not found:
        return
    for a in tl.attempts:
        if a.checkpoints:
            continue
        end = a.end if a.end is not None else math.inf
        a.checkpoints = [m.t for m in found if a.start <= m.t <= end]


def _hang_start(a: Attempt) -> None:
    """A hang starts at the last step before it was acted on, when steps were marked (the
    recorded last progress is when the log reader saw it, up to a second later)."""
    if a.hang_acted is None or not a.steps:
        return
    before = [t for t in a.steps if t <= a.hang_acted]
    if before:
        a.hang_from = max(before)


def load(run_dir: Path, run: str, events: list[dict[str, Any]]) -> Timeline:
    """The run's timeline from its folder and its events (store.files.read_events)."""
    tl = from_events(run, events)
    _from_files(tl, run_dir)
    apply_pending(tl)
    _checkpoints(tl, run_dir)
    for a in tl.attempts:
        _hang_start(a)
    if not math.isfinite(tl.submitted):
        starts = [a.start for a in tl.attempts]
        tl.submitted = min(starts) if starts else 0.0
    return tl
