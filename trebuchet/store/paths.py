"""Where trebuchet keeps its state: TREB_HOME (default ~/.trebuchet), private to the user."""

from __future__ import annotations

import os
import re
from pathlib import Path

RUN_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{3,40}$")


def treb_home() -> Path:
    """The state folder, created 0700 on first use."""
    home = Path(os.environ.get("TREB_HOME") or Path.home() / ".trebuchet").expanduser()
    if not home.is_dir():
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def runs_dir() -> Path:
    path = treb_home() / "runs"
    path.mkdir(exist_ok=True, mode=0o700)
    return path


def run_dir(run_id: str) -> Path:
    """The run's folder; the id is checked so it can never name a path outside runs/."""
    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"invalid run id {run_id!r}")
    return runs_dir() / run_id


def db_path() -> Path:
    return treb_home() / "runs.db"
