"""The run index: one SQLite file shared by every `treb` process of the user.

WAL mode lets `treb ps` read while runs write; every write is one short statement or an
IMMEDIATE transaction, and a long busy timeout waits out writers instead of failing with
"database is locked".

The index is only an index: each run directory holds its own records, so a damaged
runs.db is reported (StoreDamaged, exit 2) and left as it is, never silently replaced by
an empty one; `treb doctor --rebuild-index` (store/rebuild.py) rebuilds it from the run
directories. Opening checks only what is cheap.
"""

from __future__ import annotations

import builtins  # annotations in Store, below its method `list`
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from trebuchet.errors import StateError, UserError
from trebuchet.plain import field, fields, record
from trebuchet.runtime.contracts.schema import FirstFailure, Outcome
from trebuchet.store.paths import RUN_ID_RE, db_path, home_path
from trebuchet.store.states import ACTIVE

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    backend TEXT NOT NULL,
    launcher TEXT NOT NULL,
    state TEXT NOT NULL,
    nodes INTEGER NOT NULL,
    procs_per_node INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    exit_code INTEGER,
    first_failure TEXT,
    run_dir TEXT NOT NULL,
    spec_path TEXT,
    host TEXT,
    supervisor_pid INTEGER,
    supervisor_start TEXT,
    backend_id TEXT,
    last_seen REAL,
    git_commit TEXT,
    git_dirty INTEGER,
    sweep_id TEXT,
    params TEXT,
    waiting TEXT
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at);
CREATE INDEX IF NOT EXISTS runs_state ON runs (state);
CREATE INDEX IF NOT EXISTS runs_name ON runs (name, created_at);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    state TEXT NOT NULL,
    started_at REAL,
    ended_at REAL,
    reason TEXT,
    PRIMARY KEY (run_id, attempt)
);
CREATE TABLE IF NOT EXISTS procs (
    run_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    label TEXT NOT NULL,
    rank INTEGER,
    node INTEGER NOT NULL,
    local_rank INTEGER,
    pid INTEGER,
    exit_code INTEGER,
    signal TEXT,
    ended_at REAL,
    stopped_by_launcher INTEGER NOT NULL DEFAULT 0,
    host TEXT,
    PRIMARY KEY (run_id, attempt, label)
);
"""


# Indexes added after the first schema; older stores gain them on open (IF NOT EXISTS).
ADDED_INDEXES = ["CREATE INDEX IF NOT EXISTS runs_name ON runs (name, created_at)"]

# Columns added after the first schema; older stores gain them on open.
ADDED_COLUMNS = {
    "last_seen": "REAL", "git_commit": "TEXT", "git_dirty": "INTEGER", "sweep_id": "TEXT",
    "params": "TEXT", "waiting": "TEXT",
}  # fmt: skip
# The procs table's, likewise (host: issue 35, every process row says where it ran).
ADDED_PROC_COLUMNS = {"host": "TEXT"}
# Columns that hold JSON (decoded in RunRecord).
JSON_COLUMNS = ("first_failure", "waiting")
# A run's state and when it began and ended: written only by store/lifecycle.record
STATE_COLUMNS = ("state", "started_at", "ended_at")


@record
class RunRecord:
    """One row of `runs`; first_failure and waiting are decoded JSON."""

    id: str
    name: str
    backend: str
    launcher: str
    state: str
    nodes: int
    procs_per_node: int
    run_dir: str
    created_at: float
    attempt: int = 0
    max_attempts: int = 1
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    first_failure: FirstFailure | None = None
    spec_path: str | None = None
    host: str | None = None
    supervisor_pid: int | None = None
    supervisor_start: str | None = None
    backend_id: str | None = None
    last_seen: float | None = None
    git_commit: str | None = None
    git_dirty: int | None = None
    sweep_id: str | None = None
    params: str | None = None  # JSON of a sweep point's overrides
    # why an active run has not started, as its engine says: {reason, meaning, starts, source}
    waiting: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def duration(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.ended_at or time.time()) - self.started_at

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out["shape"] = f"{self.nodes}x{self.procs_per_node}"
        return out


@record
class RunFilter:
    """Which runs a listing wants (`treb ps`, `treb prune`); empty fields match everything.
    name: exact, or a glob when it holds * ? or [."""

    states: Sequence[str] = ()
    name: str | None = None
    backend: str | None = None
    since: float | None = None
    ended_before: float | None = None
    sweep_id: str | None = None

    def sql(self) -> tuple[list[str], list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if self.states:
            clauses.append(f"state IN ({', '.join('?' * len(self.states))})")
            args += list(self.states)
        glob = self.name is not None and any(c in self.name for c in "*?[")
        for value, clause in (
            (self.name, "name GLOB ?" if glob else "name = ?"),
            (self.backend, "backend = ?"),
            (self.since, "created_at >= ?"),
            (self.sweep_id, "sweep_id = ?"),
            (self.ended_before, "COALESCE(ended_at, created_at) < ?"),
        ):
            if value is not None:
                clauses.append(clause)
                args.append(value)
        return clauses, args


COLUMNS = [f.name for f in fields(RunRecord) if f.name != "extra"]

# The dashboard's sort keys -> SQL (a fixed list: a request never writes SQL); `?` is now.
PAGE_SORTS = {
    "created": "created_at", "name": "name", "state": "state", "backend": "backend",
    "duration": "(COALESCE(ended_at, ?) - started_at)",
}  # fmt: skip


def _record(row: sqlite3.Row) -> RunRecord:
    data = dict(row)
    for key in JSON_COLUMNS:
        if data.get(key):
            data[key] = json.loads(data[key])
    return RunRecord(**data)


SQLITE_MAGIC = b"SQLite format 3\0"
QUICK_CHECK_MAX = 1 << 20  # quick_check reads the whole file: ~2 ms per MiB (bench/store_open.py)


def proc_row(rec: Outcome, attempt_ended: bool = False) -> dict[str, Any]:
    """A process's record as a row of the procs table. Once its attempt has ended, a record
    that still says RUNNING is of a process killed before it could write its end (SIGKILL
    after the grace period, Slurm's KillWait): stopped, its exit code unknown."""
    killed = attempt_ended and rec.get("state") == "RUNNING"
    return {"label": rec.get("label"), "rank": rec.get("rank"), "node": rec.get("node") or 0,
            "local_rank": rec.get("local_rank"), "pid": rec.get("pid"),
            "exit_code": None if killed else rec.get("exit_code"),
            "signal": None if killed else rec.get("signal"), "ended_at": rec.get("ended_at"),
            "stopped_by_launcher": int(bool(rec.get("stopped_by_launcher")) or killed),
            "host": rec.get("host") if isinstance(rec.get("host"), str) else None}  # fmt: skip


class StoreDamaged(StateError):
    """runs.db is not a usable SQLite database; it was left untouched."""


def damaged(path: Path, why: str) -> StoreDamaged:
    runs = path.parent / "runs"
    return StoreDamaged(
        f"{path} is damaged ({why}); it was left as it is. The runs themselves are in "
        f"{runs}/: `treb doctor --rebuild-index` moves the damaged file aside "
        f"({path.name}.damaged-<time>) and rebuilds the index from them"
    )


def explain(exc: sqlite3.Error, path: Path | None = None) -> StateError | None:
    """What an SQLite error says about TREB_HOME, as a named error; None for the errors
    that are not about the file (a bug, a lock that outlived the busy timeout)."""
    path = path or home_path() / "runs.db"
    text = str(exc)
    if "disk is full" in text:
        return StateError(f"{path}: no space left on device: free space on TREB_HOME's file system")
    if "disk I/O error" in text:
        return StateError(f"{path}: disk I/O error on the run index; check TREB_HOME's disk")
    if "readonly" in text or "unable to open" in text:
        return StateError(
            f"{path}: cannot write the run index ({text}); TREB_HOME {path.parent} must be "
            "a writable folder (a read-only file system?); set TREB_HOME elsewhere"
        )
    if type(exc) is sqlite3.DatabaseError or "malformed" in text or "not a database" in text:
        return damaged(path, text)
    return None


def header_problem(path: Path) -> str | None:
    """Damage visible without SQLite, in the first 100 bytes and the size; None if none."""
    with open(path, "rb") as fh:
        head = fh.read(100)
        size = os.fstat(fh.fileno()).st_size
    if size == 0:
        wal = path.with_name(path.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            return None  # written by an older build, not checkpointed yet
        return "it is empty (0 bytes)"
    if not head.startswith(SQLITE_MAGIC):
        return "it is not an SQLite database: its first bytes are not SQLite's header"
    if len(head) < 100:
        return f"it is truncated ({size} bytes)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    if head[24:28] == head[92:96] and pages and size < pages * page:
        return f"it is truncated ({size} bytes; its header says {pages * page})"
    return None


def _quick_check(conn: sqlite3.Connection) -> str | None:
    """SQLite's own verdict on the file's pages; None when sound (other errors raise)."""
    try:
        rows = conn.execute("PRAGMA quick_check(3)").fetchall()
    except sqlite3.DatabaseError as exc:
        if not isinstance(explain(exc, Path("runs.db")), StoreDamaged):
            raise
        return str(exc)
    found = [r[0] for r in rows if r[0] != "ok"]
    return "; ".join(" ".join(f.split()) for f in found)[:300] or None


def create(path: Path) -> None:
    """A new, empty index that appears whole (WAL mode and the schema inside) or not at
    all: no process ever sees a 0-byte runs.db, which would read as damage."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        conn = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(SCHEMA)
        finally:
            conn.close()
        with suppress(FileExistsError):  # another process made it first: use that one
            os.link(tmp, path)
    except OSError as exc:
        raise StateError(
            f"cannot create the run index {path}: {exc.strerror} (TREB_HOME must be a "
            "writable folder with free space; set TREB_HOME elsewhere)"
        ) from None
    except sqlite3.Error as exc:
        raise explain(exc, path) or exc from None
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            with suppress(OSError):
                os.unlink(leftover)


def _warn_if_runs_exist(path: Path) -> None:
    """A new index beside run directories: runs.db was deleted or moved; say how to get
    the runs back rather than show an empty list as if nothing had ever run."""
    try:
        found = any(RUN_ID_RE.match(p.name) for p in os.scandir(path.parent / "runs"))
    except OSError:
        return
    if found:
        print(
            f"treb: warning: {path} was missing and is new, but {path.parent / 'runs'} holds "
            "runs: `treb doctor --rebuild-index` puts them back in the index",
            file=sys.stderr,
        )


# Index files this process has checked and opened. Closing any other fd of a database file
# drops every POSIX lock this process holds on it, those of live SQLite connections too
# (SQLite's documented caveat): another process closing its connection then thinks it is
# the last, checkpoints and deletes the WAL, and this process's connections read a stale
# snapshot from then on (a sweep driver waited forever for runs that had ended). So the
# header is read by a plain open() only before the first connection of the process.
_OPENED: set[str] = set()


class Store:
    """Access to runs.db; cheap to open, safe to use from many processes at once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or db_path()
        if not self.path.exists():  # private to the user, like the run directories
            create(self.path)
            _warn_if_runs_exist(self.path)
        key = os.path.realpath(self.path)
        problem = None
        checked = key in _OPENED  # this process opened it already: it was found sound then
        if not checked:  # see _OPENED: never a second fd while a connection lives
            try:
                problem = header_problem(self.path)
            except OSError as exc:
                raise StateError(f"cannot read the run index {self.path}: {exc.strerror}") from None
        self.conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute("PRAGMA busy_timeout = 60000")
            if problem or (not checked and self.path.stat().st_size <= QUICK_CHECK_MAX):
                # A header problem is confirmed by SQLite (a checkpoint may have been
                # under way); an empty file is damage whatever SQLite thinks of it.
                found = _quick_check(self.conn)
                if found or (problem and problem.startswith("it is empty")):
                    self.conn.close()
                    raise damaged(self.path, problem or found or "")
            self._init()
        except sqlite3.Error as exc:
            self.conn.close()
            raise explain(exc, self.path) or exc from None
        _OPENED.add(key)

    def _init(self) -> None:
        for _ in range(100):
            try:
                if self.conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self.conn.execute("PRAGMA journal_mode = WAL")
                self.conn.execute("PRAGMA synchronous = NORMAL")
                self._add_columns("runs", ADDED_COLUMNS)
                if not self.has_table("procs"):
                    self.create_tables(SCHEMA)
                self._add_columns("procs", ADDED_PROC_COLUMNS)
                have = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master")}
                if not {"runs_name"} <= have:
                    with self.transaction() as c:
                        for statement in ADDED_INDEXES:
                            c.execute(statement)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                time.sleep(0.05)
        raise UserError(f"{self.path}: database stayed locked")

    def _add_columns(self, table: str, added: dict[str, str]) -> None:
        """What a store made by an older build lacks."""
        cols = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
        if cols and not set(added) <= cols:
            with self.transaction() as c:
                have = {r[1] for r in c.execute(f"PRAGMA table_info({table})")}
                for name, kind in added.items():
                    if name not in have:
                        c.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def has_table(self, name: str) -> bool:
        sql = "SELECT 1 FROM sqlite_master WHERE name = ?"
        return bool(self.conn.execute(sql, (name,)).fetchone())

    def create_tables(self, schema: str) -> None:
        """`schema`'s CREATE ... IF NOT EXISTS statements, in one transaction."""
        with self.transaction() as c:
            for statement in schema.split(";"):
                if statement.strip():
                    c.execute(statement)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An IMMEDIATE transaction: takes the write lock up front, so it never deadlocks."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    # -- runs ---------------------------------------------------------------------------
    def insert_run(self, rec: RunRecord) -> None:
        data = rec.to_json()
        data.pop("shape")
        for key in JSON_COLUMNS:
            data[key] = json.dumps(data[key]) if data[key] else None
        self.insert("runs", data)

    def insert(self, table: str, row: dict[str, Any], how: str = "INSERT") -> None:
        names, marks = ", ".join(row), ", ".join(f":{k}" for k in row)
        self.conn.execute(f"{how} INTO {table} ({names}) VALUES ({marks})", row)

    def update_run(self, run_id: str, only_if_active: bool = False, **values: Any) -> bool:
        """Set columns of one run, but not its state (store/lifecycle.record writes that,
        from an event); with only_if_active, a finished run is left alone."""
        owned = sorted(set(values) & set(STATE_COLUMNS))
        if owned:
            raise ValueError(f"update_run: {owned} belong to store/lifecycle.record (an event)")
        return self.write_state(run_id, only_if_active, **values)

    def write_state(self, run_id: str, only_if_active: bool = False, **values: Any) -> bool:
        """update_run for store/lifecycle.py alone: a finished run keeps its end."""
        for key in JSON_COLUMNS:
            if values.get(key) is not None:
                values[key] = json.dumps(values[key])
        sets = ", ".join(f"{k} = :{k}" for k in values)
        sql = f"UPDATE runs SET {sets} WHERE id = :_id"
        active = ", ".join(f"'{s}'" for s in sorted(ACTIVE))
        if only_if_active:
            sql += f" AND state IN ({active})"
        elif "state" in values:  # an end is final
            sql += f" AND (state = :state OR state IN ({active}))"
        cur = self.conn.execute(sql, {**values, "_id": run_id})
        if cur.rowcount > 0 and values.get("state") == "LOST":
            # Whatever found it LOST, its unfinished attempt was lost with it (not RUNNING).
            self.conn.execute(
                "UPDATE attempts SET state = 'LOST', ended_at = COALESCE(ended_at, ?), "
                "reason = COALESCE(NULLIF(reason, ''), 'lost with the run') "
                "WHERE run_id = ? AND state IN ('PENDING', 'RUNNING', 'RETRYING')",
                (values.get("ended_at"), run_id),
            )
        return cur.rowcount > 0

    def get(self, run_id: str) -> RunRecord | None:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        return _record(row) if row else None

    def resolve(self, ref: str | None) -> RunRecord:
        """A run by id, name (its latest run) or unique id prefix; None means the latest run.
        A name that is also the prefix of another run's id is refused as ambiguous (`treb rm
        19` must never remove run 19dd4b21 when the user meant the run named "19")."""
        if ref is not None and not ref.strip():  # '' must never mean "the latest"
            raise UserError("an empty RUN names no run: give a run id, a prefix of one or a name")
        if ref is None:
            row = self.conn.execute(
                "SELECT * FROM runs ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
            if not row:
                raise UserError("no runs yet (start one with `treb run SPEC`)")
            return _record(row)
        exact = self.get(ref)
        if exact is not None:
            return exact
        named, prefixed = self._candidates(ref)
        others = [r for r in prefixed if named is None or r.id != named.id]
        if named is not None and others:
            listed = "; ".join(
                [f"run {named.id} is named {ref!r}",
                 *(f"run {r.id} ({r.name}) has an id starting with {ref!r}" for r in others)]
            )  # fmt: skip
            raise UserError(
                f"{ref!r} is ambiguous: {listed}; give the full run id"
                f" ({' or '.join([named.id, *(r.id for r in others)])})"
            )
        if named is not None:
            return named
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            raise UserError(f"run id prefix {ref!r} is ambiguous; give more characters")
        raise UserError(f"no run matches {ref!r} (see `treb ps --all`)")

    def _candidates(self, ref: str) -> tuple[RunRecord | None, builtins.list[RunRecord]]:
        """(the latest run named `ref`, up to 3 runs whose id starts with `ref`)."""
        row = self.conn.execute(
            "SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC LIMIT 1", (ref,)
        ).fetchone()
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE id LIKE ? ESCAPE '\\' ORDER BY created_at DESC LIMIT 3",
            (ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
        ).fetchall()
        return (_record(row) if row else None), [_record(r) for r in rows]

    def matches_run(self, ref: str) -> bool:
        """Whether `ref` names a run (id, id prefix or name; ambiguously too, which resolve
        then refuses): runs win over sweep ids."""
        if self.get(ref) is not None:
            return True
        named, prefixed = self._candidates(ref)
        return named is not None or bool(prefixed)

    def sweep_runs(self, ref: str) -> list[RunRecord]:
        """The runs of the sweep whose id starts with `ref` (empty: no such sweep)."""
        if not re.fullmatch(r"s[0-9a-f]{1,7}", ref):
            return []
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE sweep_id LIKE ? ORDER BY created_at", (ref + "%",)
        ).fetchall()
        runs = [_record(r) for r in rows]
        if len({r.sweep_id for r in runs}) > 1:
            raise UserError(f"sweep id prefix {ref!r} is ambiguous; give more characters")
        return runs

    def list(
        self, limit: int | None = None, active_only: bool = False, where: RunFilter | None = None
    ) -> list[RunRecord]:
        """Runs newest first, filtered in SQL (the indexes on state, name and created_at)."""
        clauses, args = (where or RunFilter()).sql()
        if active_only:
            clauses.append("state IN ('PENDING', 'RUNNING', 'RETRYING')")
        sql = "SELECT * FROM runs"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY created_at DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [_record(r) for r in self.conn.execute(sql, args).fetchall()]

    def page(
        self,
        where: RunFilter | None = None,
        sort: str = "created",
        descending: bool = True,
        offset: int = 0,
        limit: int = 100,
    ) -> tuple[builtins.list[RunRecord], int]:
        """One page of runs and how many match, sorted and filtered in SQL: 10,000 runs cost
        the dashboard one COUNT and one LIMIT query, never a full load."""
        clauses, args = (where or RunFilter()).sql()
        cond = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        total = self.conn.execute(f"SELECT COUNT(*) FROM runs{cond}", args).fetchone()[0]
        order = PAGE_SORTS.get(sort, PAGE_SORTS["created"])
        direction = "DESC" if descending else "ASC"
        sql = (f"SELECT * FROM runs{cond} ORDER BY {order} {direction}, id {direction} "
               f"LIMIT {int(limit)} OFFSET {int(offset)}")  # fmt: skip
        args = [*args, time.time()] if "?" in order else args
        return [_record(r) for r in self.conn.execute(sql, args).fetchall()], total

    def sweep_ids(self, limit: int = 200) -> builtins.list[tuple[str, str, int, float]]:
        """Recent sweeps: (sweep id, name, number of points, created), newest first."""
        rows = self.conn.execute(
            "SELECT sweep_id, MIN(name), COUNT(*), MIN(created_at) FROM runs "
            "WHERE sweep_id IS NOT NULL GROUP BY sweep_id ORDER BY MIN(created_at) DESC "
            f"LIMIT {int(limit)}"
        ).fetchall()
        return [tuple(r) for r in rows]

    # -- attempts and processes ------------------------------------------------------------
    def set_attempt(self, run_id: str, attempt: int, **values: Any) -> None:
        """Create or update one attempt's row (a new row needs a state)."""
        if "state" not in values:
            sets = ", ".join(f"{k} = :{k}" for k in values)
            self.conn.execute(
                f"UPDATE attempts SET {sets} WHERE run_id = :_r AND attempt = :_a",
                {**values, "_r": run_id, "_a": attempt},
            )
            return
        cols = {"run_id": run_id, "attempt": attempt, **values}
        names = ", ".join(cols)
        marks = ", ".join(f":{k}" for k in cols)
        updates = ", ".join(f"{k} = excluded.{k}" for k in values) or "state = state"
        self.conn.execute(
            f"INSERT INTO attempts ({names}) VALUES ({marks}) "
            f"ON CONFLICT (run_id, attempt) DO UPDATE SET {updates}",
            cols,
        )

    def attempts(self, run_id: str) -> builtins.list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT * FROM attempts WHERE run_id = ? ORDER BY attempt", (run_id,)
        ).fetchall()
        return [dict(r) for r in rows]

    def set_procs(
        self, run_id: str, attempt: int, records: Iterable[Outcome], attempt_ended: bool = False
    ) -> None:
        """The processes of an attempt, from their records (proc_row); no transaction when
        there are none (a refresh asks for every attempt of every active run)."""
        rows = [proc_row(r, attempt_ended) for r in records if isinstance(r.get("label"), str)]
        if not rows:
            return
        with self.transaction():
            for row in rows:
                cols = {"run_id": run_id, "attempt": attempt, **row}
                self.insert("procs", cols, "INSERT OR REPLACE")

    def metrics(
        self, run_id: str, names: Iterable[str] | None = None, rank: int | None = None
    ) -> dict[str, builtins.list[tuple[float, float, float]]]:
        """{name: [(step, value, time), ...]} of a run (store/metrics.py; {}: none yet)."""
        from trebuchet.store.metrics import series

        return series(self, run_id, None if names is None else list(names), rank)

    def procs(self, run_id: str, attempt: int | None = None) -> builtins.list[dict[str, Any]]:
        sql = "SELECT * FROM procs WHERE run_id = ?"
        args: list[Any] = [run_id]
        if attempt is not None:
            sql += " AND attempt = ?"
            args.append(attempt)
        sql += " ORDER BY attempt, node, rank, label"
        return [dict(r) for r in self.conn.execute(sql, args).fetchall()]
