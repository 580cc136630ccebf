"""Goodput on the Slurm test cluster: the scripted training of test_goodput.py (a rank
killed, a rank hung by `treb fault`), its figures against the script's own clock, as
locally: the job controller's records (attempt.json, result.json, events) say the same."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import slurm_conf, status, streb  # noqa: F401
from tests.integration.test_goodput import STUCK, scenario

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_goodput_on_slurm(streb, treb_home: Path, tmp_path: Path) -> None:
    scenario(streb, treb_home, tmp_path, "--on", "slurm")


def test_attempts_without_progress_stop_on_slurm(streb, tmp_path: Path) -> None:
    """The no-progress rule is the job controller's: on Slurm as locally, the fourth
    attempt (the third in a row that kept no work) ends the run, retries left or not."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    spec = write_spec(tmp_path, f"command: [{sys.executable}, {script}]\nretries: 10\n")
    res = streb("run", str(spec), "--on", "slurm", timeout=400)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert st["state"] == "FAILED"
    assert [a["reason"] for a in st["attempts"]][-1] == "no_progress: no_retry", st["attempts"]
    assert len(st["attempts"]) == 4
    events = [
        json.loads(x) for x in (Path(st["run_dir"]) / "events.jsonl").read_text().splitlines()
    ]
    assert [e["attempt"] for e in events if e["event"] == "no_progress"] == [3]
