"""The runs' metrics in the store: ingested from the files the node agents write, bounded.

The agents append points to `attempt-<n>/metrics/*.jsonl` in the run directory: never
SQLite from a compute node. The submitting side reads what is new in each file when a verb
or a refresh looks at a run.

Bounded: each series (run, name, rank) keeps at most `MAX_POINTS` rows, spread evenly over
its history (the stride doubles whenever the rows would pass the cap), its last point kept
apart so that the last value is always exact. A run keeps at most `MAX_NAMES` names. A name
is stored as a terminal shows it (SQLite refuses a lone surrogate). A value that is not a
finite number is never stored (SQLite keeps NaN as NULL, and `inf` broke every reader).
Values not kept are counted (`dropped()`).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path
from typing import Any

from trebuchet.plain import record
from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.runtime.watch.paths import MAX_NAMES
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event

MAX_POINTS = 4096
CHUNK = 4 << 20  # bytes of one file read per transaction (the write lock is held briefly)
SCHEMA = """
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    step REAL NOT NULL,
    value REAL NOT NULL,
    time REAL NOT NULL,
    rank INTEGER NOT NULL DEFAULT 0,
    seq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS metrics_run_name ON metrics (run_id, name, rank, seq);
CREATE TABLE IF NOT EXISTS metric_series (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    rank INTEGER NOT NULL,
    seen INTEGER NOT NULL,
    stride INTEGER NOT NULL,
    kept INTEGER NOT NULL,
    last_step REAL,
    last_value REAL,
    last_time REAL,
    PRIMARY KEY (run_id, name, rank)
);
CREATE TABLE IF NOT EXISTS metric_files (
    run_id TEXT NOT NULL,
    path TEXT NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (run_id, path)
);
CREATE TABLE IF NOT EXISTS metric_dropped (
    run_id TEXT NOT NULL,
    what TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (run_id, what)
);
"""
NONFINITE = "nonfinite"  # values that were not finite numbers
NAMES = "names"  # values of names past MAX_NAMES

Point = tuple[float, float, float]  # (step, value, time)


def ensure(store: Store) -> None:
    """Create the metrics tables (cheap when they exist)."""
    if not store.has_table("metric_dropped"):
        store.create_tables(SCHEMA)


def has_tables(store: Store) -> bool:
    return store.has_table("metric_series")


def files(run_dir: str) -> list[tuple[str, int]]:
    """(path relative to the run directory, rank) of every metrics file, by attempt."""
    out = []
    try:
        attempts = [e for e in os.listdir(run_dir) if e.startswith("attempt-")]
    except OSError:
        return []
    attempts = [a for a in attempts if _digits(a[8:])]
    for attempt in sorted(attempts, key=lambda a: int(a[8:])):
        folder = os.path.join(run_dir, attempt, "metrics")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            stem, _, num = name.removesuffix(".jsonl").partition("-")
            # gpu-<node>: the node's GPU samples (runtime/watch/gpu.py; the rank column: the node)
            if name.endswith(".jsonl") and stem in ("rank", "node", "gpu") and _digits(num):
                out.append((f"{attempt}/metrics/{name}", int(num)))
    return out


def _digits(text: str) -> bool:
    """ASCII digits only, at most 9 of them, as the agents name their files (the number goes
    into an INTEGER column: a planted `rank-<20 digits>.jsonl` is not read)."""
    return text.isascii() and text.isdigit() and len(text) <= 9


@record
class Series:
    seen: int = 0
    stride: int = 1
    kept: int = 0
    last: Point | None = None


def ingest(store: Store, rec: RunRecord) -> int:
    """Read what is new in a run's metrics files into the store; the points read."""
    found = files(rec.run_dir)
    if not found:
        return 0
    ensure(store)
    offsets = dict(
        store.conn.execute(
            "SELECT path, offset FROM metric_files WHERE run_id = ?", (rec.id,)
        ).fetchall()
    )
    total = 0
    for rel, rank in found:
        path = os.path.join(rec.run_dir, rel)
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if size <= offsets.get(rel, 0):
            continue
        while True:
            n = _ingest_chunk(store, rec, rel, path, rank)
            if n < 0:
                break
            total += n
    return total


def _ingest_chunk(store: Store, rec: RunRecord, rel: str, path: str, rank: int) -> int:
    """One bounded read of a file, in one transaction; -1 when nothing was left."""
    run_id = rec.id
    with store.transaction() as c:
        row = c.execute(
            "SELECT offset FROM metric_files WHERE run_id = ? AND path = ?", (run_id, rel)
        ).fetchone()
        offset = row[0] if row else 0
        try:
            with open_regular(path) as fh:
                fh.seek(offset)
                data = fh.read(CHUNK)
        except OSError:
            return -1
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) < CHUNK:
                return -1  # a line being written: next time
            cut = len(data)  # an overlong line: skipped
        points: dict[str, list[Point]] = {}
        dropped = {NONFINITE: 0, NAMES: 0}
        for line in data[:cut].splitlines():
            _decode(line, points, dropped)
        n = _add(c, run_id, rank, _capped(c, run_id, points, dropped))
        _count(c, rec, dropped)
        c.execute(
            "INSERT INTO metric_files (run_id, path, offset) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id, path) DO UPDATE SET offset = excluded.offset",
            (run_id, rel, offset + cut),
        )
        return n


def _finite(v: Any) -> float | None:
    """A number of a metrics file as a finite float, else None (bool, text, inf, NaN)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _decode(line: bytes, points: dict[str, list[Point]], dropped: dict[str, int]) -> None:
    try:
        rec = json.loads(line)
        t, s, values = _finite(rec["t"]), _finite(rec["s"]), rec["m"]
        extra = rec.get("x") or {}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return
    if isinstance(extra, dict):  # what the agent dropped (runtime/watch/metric_reader.py)
        for what in (NONFINITE, NAMES):
            n = extra.get(what)
            if isinstance(n, int) and not isinstance(n, bool) and 0 < n < 1 << 53:
                dropped[what] += n
    if not isinstance(values, dict):
        return
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        f = _finite(v)
        if f is None or t is None or s is None:
            dropped[NONFINITE] += 1
            continue
        points.setdefault(shown(str(name)), []).append((s, f, t))  # SQLite-safe, shown


def _capped(
    c: sqlite3.Connection, run_id: str, points: dict[str, list[Point]], dropped: dict[str, int]
) -> dict[str, list[Point]]:
    """The points of names the run keeps: those it has, and new ones up to MAX_NAMES."""
    known = {r[0] for r in c.execute(
        "SELECT DISTINCT name FROM metric_series WHERE run_id = ?", (run_id,))}  # fmt: skip
    kept: dict[str, list[Point]] = {}
    for name, pts in points.items():
        if name in known or len(known) < MAX_NAMES:
            known.add(name)
            kept[name] = pts
        else:
            dropped[NAMES] += len(pts)
    return kept


def _count(c: sqlite3.Connection, rec: RunRecord, dropped: dict[str, int]) -> None:
    """Add to the run's dropped counts; the first values past the name cap make an event."""
    for what, n in dropped.items():
        if not n:
            continue
        row = c.execute(
            "SELECT count FROM metric_dropped WHERE run_id = ? AND what = ?", (rec.id, what)
        ).fetchone()
        c.execute(
            "INSERT INTO metric_dropped (run_id, what, count) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id, what) DO UPDATE SET count = count + excluded.count",
            (rec.id, what, n),
        )
        if what == NAMES and row is None:  # once: the transaction decides who is first
            note = f"more than {MAX_NAMES} metric names: the later ones are not kept"
            append_event(Path(rec.run_dir), "metrics_capped", max_names=MAX_NAMES, note=note)


def _add(c: sqlite3.Connection, run_id: str, rank: int, points: dict[str, list[Point]]) -> int:
    """Insert one batch per series at the series' stride, thinning when it would overflow."""
    total = 0
    for name, pts in points.items():
        total += len(pts)
        row = c.execute(
            "SELECT seen, stride, kept FROM metric_series WHERE run_id = ? AND name = ? "
            "AND rank = ?",
            (run_id, name, rank),
        ).fetchone()
        ser = Series(*row) if row else Series()
        rows = []
        for step, value, t in pts:
            if ser.seen % ser.stride == 0:
                rows.append((ser.seen, step, value, t))
            ser.seen += 1
        while ser.kept + len(rows) > MAX_POINTS:
            ser.stride *= 2
            rows = [r for r in rows if r[0] % ser.stride == 0]
            if ser.kept:
                c.execute(
                    "DELETE FROM metrics WHERE run_id = ? AND name = ? AND rank = ? "
                    "AND seq % ? != 0",
                    (run_id, name, rank, ser.stride),
                )
                ser.kept = c.execute(
                    "SELECT count(*) FROM metrics WHERE run_id = ? AND name = ? AND rank = ?",
                    (run_id, name, rank),
                ).fetchone()[0]
        c.executemany(
            "INSERT INTO metrics (run_id, name, step, value, time, rank, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(run_id, name, s, v, t, rank, q) for q, s, v, t in rows],
        )
        ser.kept += len(rows)
        step, value, t = pts[-1]
        c.execute(
            "INSERT OR REPLACE INTO metric_series (run_id, name, rank, seen, stride, kept, "
            "last_step, last_value, last_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, name, rank, ser.seen, ser.stride, ser.kept, step, value, t),
        )
    return total


def dropped(store: Store, run_id: str) -> dict[str, int]:
    """{"nonfinite": n, "names": n} of a run: values not stored, and why (0: none)."""
    out = {NONFINITE: 0, NAMES: 0}
    if store.has_table("metric_dropped"):
        for what, n in store.conn.execute(
            "SELECT what, count FROM metric_dropped WHERE run_id = ?", (run_id,)
        ):
            out[what] = int(n)
    return out


def dropped_lines(counts: dict[str, int]) -> list[str]:
    """What `treb metrics` and a run's summary say of the values that were not kept."""
    out = []
    if counts.get(NAMES):
        out.append(f"{counts[NAMES]:,} value(s) of metric names past the first {MAX_NAMES} "
                   "were not kept (a run keeps that many names: docs/metrics.md)")  # fmt: skip
    if counts.get(NONFINITE):
        out.append(f"{counts[NONFINITE]:,} value(s) that were not finite numbers (inf, NaN) "
                   "were dropped")  # fmt: skip
    return out


def series(
    store: Store, run_id: str, names: list[str] | None = None, rank: int | None = None
) -> dict[str, list[Point]]:
    """{name: [(step, value, time), ...]} of a run, oldest first, the last point exact.
    rank None: for each name, the lowest rank that has it."""
    chosen: dict[str, tuple] = {}
    for name, r, ls, lv, lt, seen in _series(store, run_id, rank):
        if names is None or name in names:
            chosen[name] = (r, (ls, lv, lt), seen)
    out: dict[str, list[Point]] = {}
    for name in sorted(chosen):
        r, last, seen = chosen[name]
        rows = store.conn.execute(
            "SELECT step, value, time, seq FROM metrics WHERE run_id = ? AND name = ? "
            "AND rank = ? ORDER BY seq",
            (run_id, name, r),
        ).fetchall()
        pts = [(s, v, t) for s, v, t, _ in rows]
        if not rows or rows[-1][3] != seen - 1:
            pts.append(last)
        pts = [p for p in pts if _point(p)]  # what an older index stored: inf
        if pts:
            out[name] = pts
    return out


def _point(p: tuple[Any, ...]) -> bool:
    return all(_finite(x) is not None for x in p)


def latest(store: Store, run_id: str, rank: int | None = None) -> dict[str, dict[str, Any]]:
    """The last point of each series of a run: {name: {step, value, time, rank, points}}
    (rank None: the lowest rank that has the name, as series())."""
    out = {
        name: {"step": s, "value": v, "time": t, "rank": r, "points": seen}
        for name, r, s, v, t, seen in _series(store, run_id, rank)
        if _point((s, v, t))
    }
    return dict(sorted(out.items()))


def _series(store: Store, run_id: str, rank: int | None) -> list[tuple]:
    """(name, rank, last step, value, time, points seen) of each series, the lowest rank
    last (it wins); none when the store predates the metrics tables."""
    if not has_tables(store):
        return []
    sql = "SELECT name, rank, last_step, last_value, last_time, seen FROM metric_series "
    sql += "WHERE run_id = ?" + (" AND rank = ?" if rank is not None else "")
    args = (run_id,) if rank is None else (run_id, rank)
    return store.conn.execute(sql + " ORDER BY rank DESC", args).fetchall()


def remove(store: Store, run_id: str) -> None:
    """Forget a run's metrics (the run was removed)."""
    if not has_tables(store):
        return
    ensure(store)  # an older index: metric_dropped too
    with store.transaction() as c:
        for table in ("metrics", "metric_series", "metric_files", "metric_dropped"):
            c.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
