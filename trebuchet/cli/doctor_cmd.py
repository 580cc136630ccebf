"""`treb doctor`: is TREB_HOME usable, is the run index sound and complete; with
--rebuild-index, a new index from the run directories. Exit 1 when a problem remains."""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import stat
from pathlib import Path

from trebuchet.errors import StateError
from trebuchet.store.paths import home_path, tighten

LOW_SPACE = 100 << 20


def _say(ok: bool | None, text: str) -> None:
    mark = {True: "ok  ", False: "FAIL", None: "warn"}[ok]
    print(f"{mark}  {text}")


def check_home(home: Path) -> bool:
    """TREB_HOME and runs/: folders, private, writable, with room."""
    if not home.exists():
        _say(None, f"TREB_HOME {home} does not exist yet (created on the first run)")
        return True
    if not home.is_dir():
        _say(False, f"TREB_HOME {home} is not a folder (move it away or set TREB_HOME)")
        return False
    good = True
    for path, what in ((home, "TREB_HOME"), (home / "runs", "TREB_HOME/runs")):
        if not path.is_dir():
            continue
        warned = tighten(path, what)
        mode = stat.S_IMODE(path.stat().st_mode)
        _say(None if warned and mode & 0o022 else True, f"{what} {path} mode {mode:04o}")
    if not os.access(home, os.W_OK):
        _say(False, f"TREB_HOME {home} is not writable (read-only file system or permissions)")
        good = False
    free = shutil.disk_usage(home).free
    _say(free >= LOW_SPACE or None, f"{free / (1 << 20):.0f} MiB free on TREB_HOME's file system")
    return good


def check_index(home: Path) -> bool:
    """runs.db: opens, passes SQLite's full integrity check, and lists every run directory."""
    from trebuchet.store.db import Store
    from trebuchet.store.rebuild import run_dirs

    db = home / "runs.db"
    dirs = {p.name for p in run_dirs(home)}
    if not db.exists():
        more = f"; {len(dirs)} run directories do" if dirs else ""
        _say(not dirs, f"{db} does not exist{more}")
        return not dirs
    try:
        store = Store(db)
        verdict = store.conn.execute("PRAGMA integrity_check(5)").fetchall()
        problems = [r[0] for r in verdict if r[0] != "ok"]
        indexed = {r[0] for r in store.conn.execute("SELECT id FROM runs")}
        store.close()
    except StateError as exc:
        _say(False, str(exc))
        return False
    except sqlite3.DatabaseError as exc:
        _say(False, f"{db} is damaged ({exc})")
        return False
    if problems:
        _say(False, f"{db} is damaged: {'; '.join(' '.join(p.split()) for p in problems)}")
        return False
    _say(True, f"{db}: integrity check passed, {len(indexed)} runs")
    missing = sorted(dirs - indexed)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        _say(False, f"{len(missing)} run directories are not in the index: {shown}")
        return False
    gone = len(indexed - dirs)
    if gone:
        _say(None, f"{gone} indexed runs have no run directory any more (deleted by hand?)")
    return True


def _still_running() -> None:
    """A run supervised right now writes its end into the index it opened (the old one)."""
    from trebuchet.runtime.process.procs import alive
    from trebuchet.store.db import Store

    store = Store()
    for r in store.list(active_only=True):
        if r.supervisor_pid and alive(r.supervisor_pid, r.supervisor_start):
            _say(None, f"run {r.id} is still running: its end goes to the old index; run "
                 "`treb doctor --rebuild-index` again once it has ended")  # fmt: skip
    store.close()


def main(args: argparse.Namespace) -> int:
    home = home_path()
    ok = check_home(home)
    if not ok or not home.is_dir():
        return 1
    for old in sorted(home.glob("runs.db.damaged-*")):
        if not old.name.endswith(("-wal", "-shm")):
            _say(None, f"{old}: a damaged index moved aside earlier (kept for inspection)")
    if not args.rebuild_index:
        if check_index(home):
            return 0
        print("treb: `treb doctor --rebuild-index` rebuilds the index from the run directories")
        return 1
    from trebuchet.store.rebuild import rebuild

    count, moved = rebuild(home)
    if moved:
        _say(True, f"the previous index was moved to {moved}")
    _say(True, f"rebuilt {home / 'runs.db'} from {count} run directories")
    _still_running()
    return 0 if check_index(home) else 1
