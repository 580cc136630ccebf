"""Removing runs: the run directory and its index rows.

Only `runs/<id>` made from a validated id is ever removed (never the run_dir column, which
a damaged or hostile index could point anywhere). The directory goes first and the rows
after, so a removal that fails halfway leaves a run that is still listed, never a
directory nobody knows about. Disk freed counts each inode once, and only when every hard
link to it goes (the runtime archive is hard-linked from TREB_HOME/cache)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.store.db import Store
from trebuchet.store.paths import run_dir, runs_dir


def disk_used(path: Path) -> int:
    """Bytes that removing `path` gives back to the filesystem."""
    seen: dict[tuple[int, int], list[int]] = {}  # inode -> [bytes, links, links found]
    try:
        top = path.lstat()
    except FileNotFoundError:
        return 0
    entries = [top]
    if stat.S_ISDIR(top.st_mode):
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):  # gone meanwhile
                    entries.append(os.lstat(os.path.join(root, name)))
    for st in entries:
        key = (st.st_dev, st.st_ino)
        if key in seen:
            seen[key][2] += 1
        else:  # a directory's link count counts its subdirectories: it goes whole
            links = 1 if stat.S_ISDIR(st.st_mode) else st.st_nlink
            seen[key] = [st.st_blocks * 512, links, 1]
    return sum(size for size, links, found in seen.values() if found >= links)


def run_path(run_id: str) -> Path:
    """runs/<id>, refused unless it is exactly one entry of runs/."""
    try:
        path = run_dir(run_id)
    except ValueError:
        raise UserError(f"run {run_id!r}: not a run id, so not a path under runs/") from None
    if path.parent.resolve() != runs_dir().resolve():  # pragma: no cover - run_dir's regex
        raise UserError(f"run {run_id}: {path} is not under {runs_dir()}")
    return path


def remove_run(store: Store, run_id: str) -> int:
    """Delete one run's directory, then its rows; the bytes freed."""
    path = run_path(run_id)
    freed = disk_used(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        errors: list[str] = []
        shutil.rmtree(path, onerror=lambda _f, p, e: errors.append(f"{p}: {e[1]}"))
        if errors:
            raise UserError(
                f"run {run_id}: could not remove all of {path} ({errors[0]}"
                f"{f' and {len(errors) - 1} more' if len(errors) > 1 else ''}); it stays listed"
            )
    with store.transaction() as c:
        for table, key in (("procs", "run_id"), ("attempts", "run_id"), ("runs", "id")):
            c.execute(f"DELETE FROM {table} WHERE {key} = ?", (run_id,))
    from trebuchet.store.metrics import remove

    remove(store, run_id)
    return freed


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover
