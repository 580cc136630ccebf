"""A hung run on the 2-node Slurm test cluster: the job controller sees that no rank made
progress for hang_timeout, every node's agent dumps its ranks' stacks into the shared run
directory, the run ends FAILED with reason hang, and the diagnosis names the late rank,
its file:line and the collective the others wait in (as locally: test_hangs.py)."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import needs
from tests.integration.slurm_support import records, slurm_conf, status, streb  # noqa: F401
from tests.integration.test_hangs import assert_hang_diagnosis, figures, hang_spec

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


@pytest.mark.parametrize("launcher", ["native", "torchrun"])
def test_hang_on_two_nodes(launcher: str, streb, tmp_path: Path) -> None:
    needs("torch")
    spec = hang_spec(tmp_path, f"launcher: {launcher}\n")
    res = streb("run", str(spec), "--on", "slurm", timeout=400)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert st["state"] == "FAILED"
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("FAILED", "hang")]
    run_dir = Path(st["run_dir"])
    recs = records(run_dir)
    assert [recs[f"rank-{r}"]["host"] for r in range(4)] == ["tn1", "tn1", "tn2", "tn2"]
    assert all(recs[f"rank-{r}"]["stopped_by_launcher"] for r in range(4)), recs
    stacks = sorted(p.name for p in (run_dir / "attempt-0" / "stacks").glob("rank-*.txt"))
    assert stacks == [f"rank-{r}.txt" for r in range(4)]  # dumped on both nodes
    assert_hang_diagnosis(res.stderr)
    root = st["diagnosis"]["root_cause"]
    assert (root["category"], root["rank"]) == ("hang", 3)
    text = streb("status").stdout
    assert "cause: hang on rank 3" in text
    assert_hang_diagnosis(text)
    assert "hang: no rank made progress" in (run_dir / "batch.log").read_text()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events if e["event"] == "hang"] == ["fail"]
    print(launcher, figures(run_dir, 0, st))


def test_on_hang_retry_checkpoints_then_retries_on_two_nodes(streb, tmp_path: Path) -> None:
    """on_hang: retry on Slurm, as locally: the checkpoint signal to the ranks that handle
    it, the grace period for their handlers (the late rank is in time.sleep on tn2), then
    the teardown and a second attempt in the same allocation."""
    needs("torch")
    spec = hang_spec(tmp_path, "on_hang: retry\nretries: 1\n", "  HANG_CKPT: '1'\n")
    res = streb("run", str(spec), "--on", "slurm", timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert st["state"] == "SUCCEEDED"
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [
        ("FAILED", "hang"), ("SUCCEEDED", None)]  # fmt: skip
    run_dir = Path(st["run_dir"])
    assert (run_dir / "ckpt-rank-3").read_text() == "attempt 0\n"
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events if e["event"] == "hang"] == ["retry"]
