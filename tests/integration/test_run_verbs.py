"""Real runs for the verbs around runs: rerun, rm / prune, --resume-from, and the paths
shown for user code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration

# Prints the env value and the code's version, then exits with CODE.
TRAIN = 'import os\nprint("v1", os.environ["MSG"])\nraise SystemExit(int(os.environ["CODE"]))\n'


def _workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "proj"
    wd.mkdir()
    (wd / "train.py").write_text(TRAIN)
    write_spec(wd, "command: python train.py\nprocs_per_node: 2\nenv: {MSG: hi}\n")
    return wd


def test_rerun_keeps_overrides_and_code_and_refuses_like_run(treb, tmp_path: Path) -> None:
    wd = _workdir(tmp_path)
    first = treb("run", "-d", str(wd / "job.yaml"), "-o", "env.CODE=3", "-o", "env.MSG=over")
    assert first.returncode == 0, first.stderr
    rid = first.stdout.strip()
    treb("logs", "-f", rid)
    (wd / "train.py").write_text(TRAIN.replace("v1", "v2"))  # edited after the run
    again = treb("rerun", rid)
    assert again.returncode == 1, again.stderr  # same override CODE=3: fails again
    assert "v1 over" in again.stdout  # the earlier run's code and overrides
    new = status_json(treb)
    assert new["id"] != rid and new["state"] == "FAILED" and new["name"] == "job"
    snap = json.loads((Path(new["run_dir"]) / "snapshot.json").read_text())
    assert snap["source"] == str(wd)  # maps back to the user's workdir, not to the old copy
    # More overrides on top, detached: prints the new id; the code taken from the workdir now.
    res = treb("rerun", rid, "-o", "env.CODE=0", "--current-code", "-d")
    assert res.returncode == 0, res.stderr
    third = res.stdout.strip()
    treb("logs", "-f", third)
    st = status_json(treb, third)
    assert st["state"] == "SUCCEEDED"
    assert "v2 over" in treb("logs", third).stdout
    # The same refusals as `treb run`, before anything is recorded.
    count = len(json.loads(treb("ps", "--all", "--json").stdout))
    bad = treb("rerun", rid, "-o", "nodes=0")
    assert bad.returncode == 2 and "-o nodes=0: nodes: must be an integer" in bad.stderr
    bad = treb("rerun", rid, "--on", "nowhere")
    assert bad.returncode == 2 and "unknown engine" in bad.stderr
    assert len(json.loads(treb("ps", "--all", "--json").stdout)) == count
    assert treb("rerun", "zzzz").returncode == 2
