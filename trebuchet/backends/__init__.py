"""Engines that run a spec. Each module implements the small Backend interface in base.py."""

from __future__ import annotations

import importlib

from trebuchet.backends.base import Backend
from trebuchet.errors import UserError

KNOWN = {"local": "trebuchet.backends.local"}
KNOWN["slurm"] = "trebuchet.backends.slurm"  # sbatch script; submits, follows, cancels
KNOWN["skypilot"] = "trebuchet.backends.skypilot"  # renders a task; runs via SkyPilot
KNOWN["kubernetes"] = "trebuchet.backends.kubernetes"  # renders manifests; applies them


def get_backend(name: str) -> Backend:
    """The backend called `name`, imported only when asked for (keeps the CLI fast)."""
    module = KNOWN.get(name)
    if module is None:
        raise UserError(f"--on {name}: unknown backend (available here: {', '.join(KNOWN)})")
    return importlib.import_module(module).BACKEND
