"""Rebuild runs.db from the run directories, which hold every run's own records.

The run directories and TREB_HOME's sweeps/ and nodes-cleared.jsonl hold all the index
holds, so a damaged index loses nothing that is not recomputed. Nothing here knows an
engine: an engine's submission event carries the run's `backend_id` (older run directories
named it `job_id`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from trebuchet import registry
from trebuchet.runtime.contracts.schema import FirstFailure, Outcome, allowed
from trebuchet.runtime.rundir.records import cause, first_failure, read_json
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.store import nodes
from trebuchet.store.db import RunRecord, Store, create, header_problem, proc_row
from trebuchet.store.files import read_events
from trebuchet.store.lifecycle import columns
from trebuchet.store.paths import RUN_ID_RE
from trebuchet.store.states import ACTIVE, FAILED, PENDING, RUNNING, SUCCEEDED, TERMINAL


@dataclass
class Recovered:
    """One run as its directory tells it."""

    record: RunRecord
    attempts: dict[int, dict[str, Any]] = field(default_factory=dict)
    procs: list[dict[str, Any]] = field(default_factory=list)


def _json(path: Path) -> Any:
    """The JSON in `path`, None when unreadable (a rank's FIFO there never blocks)."""
    return read_json(str(path))


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's events; a line cut by a full disk is skipped, the others still count."""
    return read_events(run_dir)


def _spec(run_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The resolved spec and the file it was resolved from."""
    import yaml

    try:
        text = read_text(run_dir / "spec.yaml")  # a regular file only: a rank can reach it
    except OSError:
        return {}, None
    source = None
    if text.startswith("# resolved from "):
        source = text.splitlines()[0][len("# resolved from ") :].strip() or None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        data = None
    return (data if isinstance(data, dict) else {}), source


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def recover(run_dir: Path, sweeps: dict[str, tuple[str, dict]]) -> Recovered:
    """The index rows of one run directory."""
    spec, source = _spec(run_dir)
    events = _events(run_dir)
    rid = run_dir.name
    ppn = _int(spec.get("procs_per_node"), 0)
    gpus = _int(spec.get("gpus_per_node"), 0)
    rec = RunRecord(
        id=rid, name=str(spec.get("name") or rid), backend=registry.DEFAULT,
        launcher=str(spec.get("launcher") or "native"), state=PENDING,
        nodes=_int(spec.get("nodes"), 1), procs_per_node=ppn or gpus or 1,
        run_dir=str(run_dir), created_at=run_dir.stat().st_mtime,
        max_attempts=_int(spec.get("retries"), 0) + 1,
        spec_path=source if source and source.startswith("/") else None,
    )  # fmt: skip
    out = Recovered(rec)
    env_failure: FirstFailure | None = None
    for ev in events:
        kind, when = ev.get("event"), ev.get("time")
        cols = columns(ev)  # the run's state, as the live index took it (store/lifecycle.py)
        if "state" in cols and allowed(rec.state, cols["state"]):
            for key, value in cols.items():
                setattr(rec, key, max(rec.attempt, _int(value, 0)) if key == "attempt" else value)
        if kind == "submitted":
            rec.backend = str(ev.get("backend") or rec.backend)
            rec.created_at = when or rec.created_at
        elif kind == "attempt_started":
            n = _int(ev.get("attempt"), 0)
            out.attempts[n] = {"state": RUNNING, "started_at": when}
        elif kind == "attempt_ended":
            n = _int(ev.get("attempt"), 0)
            out.attempts.setdefault(n, {}).update(state=ev.get("state"), ended_at=when)
        elif kind == "log_policy":
            n = _int(ev.get("attempt"), 0)
            out.attempts.setdefault(n, {})["reason"] = f"{ev.get('policy')}: {ev.get('action')}"
        elif kind == "environment_failed":
            out.attempts[0] = {"state": FAILED, "ended_at": when,
                               "reason": "environment build failed"}  # fmt: skip
            env_failure = cause("environment", 1, 0, log=str(run_dir / "environment.log"),
                                message=ev.get("error"))  # fmt: skip
            env_failure["ended_at"] = when
        if "backend_id" in ev:  # the engine's submission: its id for the run's job
            rec.backend_id = None if ev["backend_id"] is None else str(ev["backend_id"])
        elif ev.get("job_id") is not None:  # written before backend_id
            rec.backend_id = str(ev["job_id"])
    _engine_files(run_dir, out)
    _proc_records(run_dir, out)
    ff = first_failure(_records(run_dir / f"attempt-{rec.attempt}"))
    if ff:
        ff.pop("state", None)
        ff["attempt"] = rec.attempt
        ff["log"] = str(run_dir / f"attempt-{rec.attempt}" / _log_name(ff))
    rec.first_failure = ff or env_failure
    rec.last_seen = rec.ended_at or rec.started_at
    if rec.first_failure:
        rec.exit_code = rec.first_failure.get("exit_code")
    elif rec.state == SUCCEEDED:
        rec.exit_code = 0
    rec.max_attempts = max(rec.max_attempts, rec.attempt + 1)
    snap = _json(run_dir / "snapshot.json") or {}
    rec.git_commit = snap.get("git_commit")
    rec.git_dirty = None if snap.get("git_dirty") is None else int(bool(snap["git_dirty"]))
    if rid in sweeps:
        rec.sweep_id, params = sweeps[rid]
        rec.params = json.dumps(params, sort_keys=True)
    for att in out.attempts.values():  # an attempt of an ended run cannot still run
        if att.get("state") in (None, RUNNING) and rec.state in TERMINAL:
            att["state"] = rec.state
    return out


def _log_name(rec: Outcome) -> str:
    if rec.get("rank") is not None:
        return f"rank-{rec['rank']}.log"
    return f"{rec.get('label') or 'node-' + str(rec.get('node'))}.log".replace(":", "-")


def _engine_files(run_dir: Path, out: Recovered) -> None:
    """What a controller in the job wrote (Slurm's): each attempt's state and the result."""
    for adir in run_dir.glob("attempt-*"):
        att = _json(adir / "attempt.json")
        n = adir.name.split("-", 1)[1]
        if isinstance(att, dict) and n.isdigit():
            row = out.attempts.setdefault(int(n), {})
            for key in ("state", "started_at", "ended_at", "reason"):
                if att.get(key) is not None:
                    row[key] = att[key]
            out.record.attempt = max(out.record.attempt, int(n))
    result = _json(run_dir / "result.json")
    if isinstance(result, dict) and result.get("state") in TERMINAL | ACTIVE:
        out.record.state = result["state"]
        out.record.ended_at = result.get("ended_at") or out.record.ended_at


def _records(adir: Path) -> list[Outcome]:
    """The outcome records of one attempt (each process's; not the attempt's own)."""
    out: list[Outcome] = []
    for path in sorted(adir.glob("*.json")):
        data = _json(path)
        if isinstance(data, dict) and "label" in data and "node" in data:
            out.append(cast("Outcome", data))
    return out


def _proc_records(run_dir: Path, out: Recovered) -> None:
    for adir in sorted(run_dir.glob("attempt-*")):
        n = adir.name.split("-", 1)[1]
        if not n.isdigit():
            continue
        out.procs += [{**proc_row(data), "attempt": int(n)} for data in _records(adir)]


def _sweeps(home: Path) -> dict[str, tuple[str, dict]]:
    found: dict[str, tuple[str, dict]] = {}
    for path in (home / "sweeps").glob("*.json"):
        data = _json(path)
        if not isinstance(data, dict):
            continue
        for run in data.get("runs") or []:
            if isinstance(run, dict) and run.get("id"):
                found[str(run["id"])] = (str(data.get("id") or path.stem), run.get("params") or {})
    return found


def run_dirs(home: Path) -> list[Path]:
    try:
        found = (home / "runs").iterdir()
        return sorted(p for p in found if RUN_ID_RE.match(p.name) and p.is_dir())
    except FileNotFoundError:
        return []


def rebuild(home: Path) -> tuple[int, Path | None]:
    """Write a new runs.db from the run directories; the old file (damaged or not) is moved
    aside, never deleted. Returns (runs indexed, where the old file went)."""
    db = home / "runs.db"
    tmp = home / f".runs.db.{os.getpid()}.rebuild"
    for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
        leftover.unlink(missing_ok=True)
    sweeps = _sweeps(home)
    create(tmp)
    store = Store(tmp)
    count = 0
    try:
        with store.transaction():
            for path in run_dirs(home):
                got = recover(path, sweeps)
                store.insert_run(got.record)
                for n, att in sorted(got.attempts.items()):
                    store.set_attempt(got.record.id, n, **{"state": PENDING, **att})
                for p in got.procs:
                    store.insert("procs", {"run_id": got.record.id, **p}, "INSERT OR REPLACE")
                count += 1
        nodes.sync(store)  # each run's node marks, once (store/nodes.py)
        nodes.restore_clears(store, home)
    finally:
        store.close()
    moved = None
    if db.exists():
        try:
            kind = "damaged" if header_problem(db) or _damaged(db) else "replaced"
        except OSError:
            kind = "damaged"
        moved = home / f"runs.db.{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        if moved.exists():
            moved = Path(f"{moved}-{os.getpid()}")
        os.rename(db, moved)
        wal = home / "runs.db-wal"
        if wal.exists():
            os.rename(wal, f"{moved}-wal")
        (home / "runs.db-shm").unlink(missing_ok=True)
    os.rename(tmp, db)
    return count, moved


def _damaged(db: Path) -> bool:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA integrity_check(1)").fetchone()[0] != "ok"
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        return True
