"""Code snapshots: a queued or retried run executes the code as it was at submission.

In a git repository the snapshot holds the tracked files as they are in the working tree
(uncommitted edits included, recorded as dirty) and leaves untracked files out, with a
warning that names them. Elsewhere it holds every file that .gitignore does not exclude.
`.trebignore` (gitignore syntax) excludes more in both cases.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.store.paths import treb_home

UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B?)\s*", text.upper())
    if not m:
        raise ValueError("bad size")
    unit = m.group(2) if m.group(2).endswith("B") or not m.group(2) else m.group(2) + "B"
    return int(float(m.group(1)) * UNITS[unit])


@dataclass
class Snapshot:
    """What was copied, and what the run record says about the code."""

    path: str
    files: int = 0
    bytes: int = 0
    git_commit: str | None = None
    git_dirty: bool | None = None
    untracked_left_out: list[str] = field(default_factory=list)


def _git(workdir: Path, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(workdir), *args], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _ignore_spec(path: Path):  # -> pathspec.PathSpec | None
    if not path.is_file():
        return None
    import pathspec

    return pathspec.PathSpec.from_lines("gitwildmatch", path.read_text().splitlines())


def list_files(workdir: Path) -> tuple[list[str], Snapshot]:
    """Relative paths to copy, and the git facts of the workdir."""
    info = Snapshot(path="")
    home = _inside(treb_home(), workdir)
    tracked = _git(workdir, "ls-files", "-z", "--cached")
    if tracked is not None:
        files = [f for f in tracked.split("\0") if f and (workdir / f).exists()]
        others = _git(workdir, "ls-files", "-z", "--others", "--exclude-standard") or ""
        info.untracked_left_out = [f for f in others.split("\0") if f]
        info.git_commit = (_git(workdir, "rev-parse", "HEAD") or "").strip() or None
        status = _git(workdir, "status", "--porcelain", "--untracked-files=no", "--", ".")
        info.git_dirty = bool(status and status.strip())
    else:
        gitignore = _ignore_spec(workdir / ".gitignore")
        files = []
        for root, dirs, names in os.walk(workdir):
            rel_root = Path(root).relative_to(workdir)
            dirs[:] = [d for d in dirs if d != ".git" and str(rel_root / d) != home and not (
                gitignore and gitignore.match_file(f"{rel_root / d}/"))]  # fmt: skip
            for n in names:
                rel = str(rel_root / n) if str(rel_root) != "." else n
                if not (gitignore and gitignore.match_file(rel)):
                    files.append(rel)
    if home:  # never snapshot trebuchet's own state (it holds this very run)
        files = [f for f in files if not (f == home or f.startswith(home + "/"))]
    trebignore = _ignore_spec(workdir / ".trebignore")
    if trebignore:
        files = [f for f in files if not trebignore.match_file(f)]
        info.untracked_left_out = [
            f for f in info.untracked_left_out if not trebignore.match_file(f)
        ]
    return sorted(files), info


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _inside(path: Path, root: Path) -> str | None:
    """`path` relative to `root` when it lies inside it."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return None


def take(workdir: Path, dest: Path, max_bytes: int) -> Snapshot:
    """Copy the workdir's files into `dest`; refuse above `max_bytes` before copying."""
    files, info = list_files(workdir)
    sizes = {f: (workdir / f).lstat().st_size for f in files}
    total = sum(sizes.values())
    if total > max_bytes:
        biggest = sorted(sizes, key=sizes.get, reverse=True)[:3]  # type: ignore[arg-type]
        raise UserError(
            f"snapshot of {workdir} would be {_size(total)}, over the "
            f"{_size(max_bytes)} limit (largest: {', '.join(biggest)}); exclude "
            "files in .trebignore, raise snapshot_max_size, or set snapshot: false"
        )
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f in files:
        src, dst = workdir / f, dest / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    info.path, info.files, info.bytes = str(dest), len(files), total
    return info
