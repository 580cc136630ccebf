"""Where trebuchet keeps its state: TREB_HOME (default ~/.trebuchet), private to the user.

One that others may write to is tightened to 0700 with a warning: whoever can write there
can replace runs.db or plant files in a run directory.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

from trebuchet.errors import StateError

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{3,40}$")

_checked: set[str] = set()  # folders whose mode was looked at by this process


def home_path() -> Path:
    """TREB_HOME as configured, whether or not it exists (nothing is created)."""
    return Path(os.environ.get("TREB_HOME") or Path.home() / ".trebuchet").expanduser()


def treb_home() -> Path:
    """The state folder, created 0700 on first use."""
    home = home_path()
    if str(home) not in _checked and (home / "runs").is_dir():
        tighten(home / "runs", "TREB_HOME/runs")
    _ensure_dir(home, "TREB_HOME")
    return home


def runs_dir() -> Path:
    path = treb_home() / "runs"
    _ensure_dir(path, "TREB_HOME/runs")
    return path


def _ensure_dir(path: Path, what: str) -> None:
    if path.is_dir():
        if str(path) not in _checked:
            _checked.add(str(path))
            tighten(path, what)
        return
    if path.exists() or path.is_symlink():
        kind = "a broken symlink" if not path.exists() else "not a folder"
        raise StateError(
            f"{what} {path} is {kind}: trebuchet keeps its runs in a folder there "
            "(move it away, or set TREB_HOME to a folder)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StateError(
            f"cannot create {what} {path}: {exc.strerror} (set TREB_HOME to a writable folder)"
        ) from None
    _checked.add(str(path))


def tighten(path: Path, what: str) -> str | None:
    """Make a folder others may write to private again (0700); the warning printed, or None."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    if not mode & 0o022:  # read access for the group (a shared file system) is a choice
        return None
    try:
        os.chmod(path, 0o700)
        text = f"{what} {path} had mode {mode:04o} (others could write to it); set it to 0700"
    except OSError as exc:
        text = (
            f"{what} {path} has mode {mode:04o}: others can write to it, and it could not "
            f"be changed ({exc.strerror}); run `chmod 700 {path}`"
        )
    print(f"treb: warning: {text}", file=sys.stderr)
    return text


def run_dir(run_id: str) -> Path:
    """The run's folder; the id is checked so it can never name a path outside runs/."""
    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    return runs_dir() / run_id


def db_path() -> Path:
    return treb_home() / "runs.db"


def sweep_file(sweep_id: str) -> Path:
    path = treb_home() / "sweeps"
    path.mkdir(exist_ok=True, mode=0o700)
    return path / f"{sweep_id}.json"
