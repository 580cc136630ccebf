"""Goodput on the Slurm test cluster: the scripted training of test_goodput.py (a rank
killed, a rank hung by `treb fault`), its figures against the script's own clock, as
locally: the job controller's records (attempt.json, result.json, events) say the same."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.slurm_support import slurm_conf, streb  # noqa: F401
from tests.integration.test_goodput import scenario

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_goodput_on_slurm(streb, treb_home: Path, tmp_path: Path) -> None:
    scenario(streb, treb_home, tmp_path, "--on", "slurm")
