"""Nodes remembered across runs (docs/nodes.md): each node's marks in TREB_HOME's index, a
score that halves every half-life, and the nodes a new submission avoids.

The marks come from the run directories (node_events.py), kept once per (run, mark): it
does not matter how often a run is read, nor whether the index was rebuilt. `treb nodes
--clear` forgets the marks the index holds of a node then, by their (run, key), never by
comparing their times with the clear's (each is dated by another machine's clock); kept
also in TREB_HOME/nodes-cleared.jsonl so that a rebuilt index forgets the same ones.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trebuchet import registry
from trebuchet.errors import UserError
from trebuchet.store import node_events
from trebuchet.store.db import Store, explain
from trebuchet.store.paths import home_path
from trebuchet.store.states import TERMINAL

TABLES = """
CREATE TABLE IF NOT EXISTS node_events (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    host TEXT NOT NULL,
    kind TEXT NOT NULL,
    time REAL NOT NULL,
    detail TEXT,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX IF NOT EXISTS node_events_host ON node_events (host, time);
CREATE TABLE IF NOT EXISTS node_scans (
    run_id TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    done INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node_clears (
    host TEXT PRIMARY KEY,
    time REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS node_cleared (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
"""
# An index from before node_cleared: its clears forget what they did then, by time, once.
BY_TIME = """
INSERT OR IGNORE INTO node_cleared (run_id, key) SELECT e.run_id, e.key FROM node_events e
JOIN node_clears c ON c.host = e.host WHERE e.time <= c.time
"""
# What one mark weighs: a loss (or an unhealthy node, a hardware failure) is twice the
# default threshold, so one keeps its node out for one half-life; a straggler, a quarter.
WEIGHTS = {"lost": 2.0, "unhealthy": 2.0, "hardware": 2.0, "straggler": 0.5}
HALF_LIFE_S = 24 * 3600.0
THRESHOLD = 1.0
HALF_LIFE_ENV, THRESHOLD_ENV = "TREB_NODE_HALF_LIFE", "TREB_NODE_THRESHOLD"
CLEARS = "nodes-cleared.jsonl"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Settings:
    """How fast marks fade and how high a score keeps a node out (0 or less: never)."""

    half_life_s: float = HALF_LIFE_S
    threshold: float = THRESHOLD

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """TREB_NODE_HALF_LIFE (90m, 24h, 7d, seconds) and TREB_NODE_THRESHOLD (0 or `off`:
        no node is ever avoided)."""
        env = dict(os.environ if env is None else env)
        half, limit = HALF_LIFE_S, THRESHOLD
        text = env.get(HALF_LIFE_ENV, "").strip().lower()
        if text:
            given = _seconds(text)
            if given is None:
                raise UserError(f"{HALF_LIFE_ENV}={text!r}: expected a duration such as 12h, "
                                "7d, 90m or a number of seconds")  # fmt: skip
            half = given
        text = env.get(THRESHOLD_ENV, "").strip().lower()
        if text:
            try:
                limit = 0.0 if text == "off" else float(text)
            except ValueError:
                limit = math.nan
            if not math.isfinite(limit):
                raise UserError(f"{THRESHOLD_ENV}={text!r}: expected a number (0 or off: "
                                "never avoid a node)")  # fmt: skip
        return cls(half, limit)


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)([smhd])", text)
        if not parts or re.sub(r"[0-9]+(?:\.[0-9]+)?[smhd]", "", text):
            return None
        value = sum(float(n) * _UNITS[u] for n, u in parts)
    return value if math.isfinite(value) and 0 < value <= 3650 * 86400 else None


def decayed(weight: float, age_s: float, half_life_s: float) -> float:
    """A mark's weight `age_s` seconds later (a mark from the future counts in full)."""
    return weight * 0.5 ** (max(0.0, age_s) / half_life_s)


@dataclass
class Node:
    """One node's history: its score now, its marks since the last clear, by kind."""

    host: str
    score: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    last_time: float | None = None
    last_kind: str | None = None
    last_run: str | None = None
    last_detail: str = ""
    cleared: float | None = None
    excluded: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "score": round(self.score, 4), "excluded": self.excluded,
                "counts": {k: self.counts.get(k, 0) for k in node_events.KINDS},
                "last": None if self.last_time is None else {
                    "time": self.last_time, "kind": self.last_kind, "run": self.last_run,
                    "detail": self.last_detail},
                "cleared": self.cleared}  # fmt: skip


def score(marks: Iterable[tuple[str, float]], now: float, settings: Settings) -> float:
    """The sum of the marks' (kind, time) weights, each halved per half-life of its age."""
    return sum(decayed(WEIGHTS.get(k, 0.0), now - t, settings.half_life_s) for k, t in marks)


_SANE = "WHERE typeof(host) = 'text' AND typeof(time) IN ('real', 'integer')"


# -- the tables ------------------------------------------------------------------------------
def _tables(store: Store) -> None:
    have = {name for (name,) in store.conn.execute(
        "SELECT name FROM sqlite_master WHERE name IN ('node_events', 'node_scans', "
        "'node_clears', 'node_cleared')")}  # fmt: skip
    if len(have) < 4:
        store.create_tables(TABLES)
        if "node_clears" in have and "node_cleared" not in have:
            store.create_tables(BY_TIME)


def _guarded(store: Store) -> None:
    """The tables, or the index's damage as a named error (StoreDamaged, exit 2)."""
    try:
        _tables(store)
    except sqlite3.Error as exc:
        raise explain(exc, store.path) or exc from None


def _size(run_dir: Path) -> int:
    try:
        return os.stat(run_dir / "events.jsonl").st_size
    except OSError:
        return 0


def record_run(store: Store, run_id: str, run_dir: Path, ended: bool, attempts: int,
               width: int, ran: int | None = None) -> int:  # fmt: skip
    """One run's marks into the index (each once); how many were new. A mark of an attempt
    past the `attempts` the index says the run had is no mark: a rank can write the files,
    and would let one run count against a node 10^6 times. Nor is a mark of a node the
    attempt did not run on (at most `width` of them, the run's nodes; an attempt past the
    `ran` the index has seen start ran on none: a rank can write the records of the
    attempts to come): said once in the run's events (of those to come: once it ended)."""
    ran = attempts if ran is None else max(1, min(ran, attempts))
    seen = node_events.read_run(run_dir, attempts)
    found = [e for e in seen.marks if e.attempt is None or e.attempt < attempts]
    found, ignored = node_events.scoped(run_dir, seen, found, ran, width)
    if not ended:  # an attempt the index has not seen start yet may be starting now
        ignored = [e for e in ignored if e.attempt is None or e.attempt < ran]
    node_events.say_ignored(run_dir, ignored, seen.said)
    now = time.time()  # a mark dated in the future (a rank can write the events) is now
    new = 0
    with store.transaction() as c:
        for ev in found:
            cur = c.execute(
                "INSERT OR IGNORE INTO node_events (run_id, key, host, kind, time, detail) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, ev.key, ev.host, ev.kind, min(ev.time, now), ev.detail),
            )
            new += cur.rowcount
        c.execute(
            "INSERT OR REPLACE INTO node_scans (run_id, size, done) VALUES (?, ?, ?)",
            (run_id, _size(run_dir), int(ended)),
        )
    return new


def sync(store: Store) -> int:
    """Read the runs not read since they last changed (an ended run: once); new marks."""
    _guarded(store)
    rows = store.conn.execute(
        "SELECT r.id, r.run_dir, r.state, r.backend, s.size, "
        "MAX(r.attempt + 1, r.max_attempts), r.nodes, r.attempt + 1 FROM runs r "
        "LEFT JOIN node_scans s ON s.run_id = r.id WHERE s.done IS NULL OR s.done = 0"
    ).fetchall()
    new = 0
    simulated = {r.name for r in registry.registry.values() if not r.real_nodes}
    for run_id, run_dir, state, backend, size, attempts, width, ran in rows:
        path = Path(run_dir)
        ended = state in TERMINAL
        if size is not None and not ended and size == _size(path):
            continue  # a run still going whose events did not change
        if backend in simulated:  # its nodes are no machines (local's: launcher/sim_nodes.py)
            store.conn.execute("INSERT OR REPLACE INTO node_scans (run_id, size, done) "
                               "VALUES (?, 0, 1)", (run_id,))  # fmt: skip
            continue
        new += record_run(store, run_id, path, ended, int(attempts or 1), int(width or 1),
                          int(ran or 1))  # fmt: skip
    return new


def clear(store: Store, hosts: list[str], when: float | None = None) -> None:
    """The marks of these nodes the index holds now (call sync first) no longer count; a
    mark read later does, whatever its time says. `when` is only shown."""
    _guarded(store)
    when = time.time() if when is None else when
    path = store.path.parent / CLEARS
    try:  # opened first: a FIFO there fails at once (no reader), and nothing is cleared
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror or exc}: remove it (it keeps the clears "
                        "for a rebuilt index)") from None  # fmt: skip
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{path}: not a regular file: remove it (it keeps the clears "
                            "for a rebuilt index)")  # fmt: skip
        lines = []
        with store.transaction() as c:
            for host in hosts:
                c.execute("INSERT OR REPLACE INTO node_clears (host, time) VALUES (?, ?)",
                          (host, when))  # fmt: skip
                marks = [(r, k) for r, k in c.execute(
                    "SELECT run_id, key FROM node_events WHERE host = ? AND "
                    "typeof(run_id) = 'text' AND typeof(key) = 'text'", (host,))]  # fmt: skip
                c.executemany("INSERT OR IGNORE INTO node_cleared (run_id, key) VALUES (?, ?)",
                              marks)  # fmt: skip
                lines.append({"host": host, "time": when, "marks": [list(m) for m in marks]})
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a half line (a crash, a full
                data = b"\n" + data  # disk) ends there: ours is a line of its own
            while data:
                data = data[os.write(fd, data) :]  # a short write is no clear kept
        except OSError as exc:
            raise UserError(f"{path}: {exc.strerror or exc}: the marks are cleared in the "
                            "index, but a rebuilt index will not know it") from None  # fmt: skip
    finally:
        os.close(fd)


def restore_clears(store: Store, home: Path) -> int:
    """The clears TREB_HOME/nodes-cleared.jsonl keeps (a rebuild, after sync): the marks
    each forgot (a line from before they were kept: those not later than its time); how
    many hosts have one."""
    _guarded(store)
    text = node_events.tail(home / CLEARS, 4 << 20)  # a regular file's last 4 MiB only
    latest: dict[str, float] = {}
    forgot: set[tuple[str, str]] = set()
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        host, when = node_events.valid_host(rec.get("host")), rec.get("time")
        if not (host and isinstance(when, (int, float)) and math.isfinite(when)):
            continue
        latest[host] = max(latest.get(host, 0.0), float(when))
        marks = rec.get("marks")
        if not isinstance(marks, list):
            forgot.update((r, k) for r, k in store.conn.execute(
                f"SELECT run_id, key FROM node_events {_SANE} AND typeof(run_id) = 'text' "
                "AND typeof(key) = 'text' AND host = ? AND time <= ?", (host, when)))  # fmt: skip
            continue
        forgot.update((m[0], m[1]) for m in marks if isinstance(m, list) and len(m) == 2
                      and isinstance(m[0], str) and isinstance(m[1], str))  # fmt: skip
    with store.transaction() as c:
        for host, when in latest.items():
            c.execute("INSERT OR REPLACE INTO node_clears (host, time) VALUES (?, ?)", (host, when))
        c.executemany("INSERT OR IGNORE INTO node_cleared (run_id, key) VALUES (?, ?)", forgot)
    return len(latest)


def nodes(store: Store, settings: Settings, now: float | None = None) -> list[Node]:
    """Every node with a mark, highest score first (after sync: call it first)."""
    _guarded(store)
    now = time.time() if now is None else now
    # Only rows as treb writes them: the index is a shared file, and a row that is not
    # (a time that is text, a host that is no node name) is no mark, never an exception.
    clears = {h: t for h, t in store.conn.execute(f"SELECT host, time FROM node_clears {_SANE}")
              if node_events.valid_host(h) and math.isfinite(t)}  # fmt: skip
    forgot = {(r, k) for r, k in store.conn.execute("SELECT run_id, key FROM node_cleared")}
    out: dict[str, Node] = {}
    marks: dict[str, list[tuple[str, float]]] = {}
    rows = store.conn.execute(
        f"SELECT host, kind, time, run_id, detail, key FROM node_events {_SANE} ORDER BY time"
    ).fetchall()
    for host, kind, when, run_id, detail, key in rows:
        if kind not in WEIGHTS or not node_events.valid_host(host) or not math.isfinite(when):
            continue
        node = out.setdefault(host, Node(host, cleared=clears.get(host)))
        if (run_id, key) in forgot:
            continue
        run_id, detail = str(run_id), detail if isinstance(detail, str) else ""
        node.counts[kind] = node.counts.get(kind, 0) + 1
        node.last_time, node.last_kind, node.last_run = when, kind, run_id
        node.last_detail = detail or ""
        marks.setdefault(host, []).append((kind, when))
    for node in out.values():
        node.score = score(marks.get(node.host, []), now, settings)
        node.excluded = settings.threshold > 0 and node.score >= settings.threshold
    return sorted(out.values(), key=lambda n: (-n.score, n.host))


def known_hosts(store: Store) -> list[str]:
    _guarded(store)
    found = store.conn.execute(f"SELECT DISTINCT host FROM node_events {_SANE} ORDER BY host")
    return [h for (h,) in found if node_events.valid_host(h)]


# -- what a submission avoids ------------------------------------------------------------------
def avoided(allow: Iterable[str] = (), store: Store | None = None) -> list[Node]:
    """The nodes a new submission keeps off (score at or past the threshold), except those
    the spec allows (`allow_nodes`; `*`: all)."""
    allowed = set(allow)
    if "*" in allowed:
        return []
    settings = Settings.from_env()
    if settings.threshold <= 0:
        return []
    own = store is None
    if own and not (home_path() / "runs.db").exists():
        return []  # no run yet, so no history (a render creates no index)
    store = store or Store()
    try:
        try:
            sync(store)
            return [n for n in nodes(store, settings) if n.excluded and n.host not in allowed]
        except sqlite3.Error as exc:
            raise explain(exc, store.path) or exc from None
    finally:
        if own:
            store.close()


def why(node: Node) -> str:
    """`tn2 (score 2.0: 1 lost, last 12:01:07 in run 4f2a91c0)`."""
    counts = ", ".join(f"{v} {k}" for k, v in node.counts.items() if v)
    last = ""
    if node.last_time is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(node.last_time))
        last = f", last {stamp} in run {node.last_run}"
    from trebuchet.runtime.watch.display_lines import shown  # a damaged row's run id: as text

    return shown(f"{node.host} (score {node.score:.1f}: {counts}{last})")


def note(skipped: list[Node], how: str) -> str:
    """The one line a submission says about the nodes it avoids."""
    names = ", ".join(why(n) for n in skipped)
    return (f"treb: avoiding {len(skipped)} node(s) with a bad history ({how}): {names}; "
            "`treb nodes` shows why; allow_nodes: [HOST] in the spec (or -o allow_nodes=HOST) "
            "uses one anyway, `treb nodes --clear HOST` forgets its history")  # fmt: skip
