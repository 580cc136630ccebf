"""Issue 38 item 3 on the 2-node Slurm test cluster: the HF Trainer (scripts/hf_tiny.py, only
rank 0 prints) with rank 0 on tn1 stopped by `treb fault RUN hang-rank 0`: the job
controller's hang watch keeps each rank's habit, tn1's agent reads the stopped rank with
py-spy --nonblocking, and the diagnosis blames rank 0, not rank 1 (silent since its start
on tn2), as locally (test_hang_blame.py). Outcomes only."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import needs, needs_program
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    records,
    slurm_conf,
    status,
    streb,
    wait_for,
)
from tests.integration.test_hang_blame import assert_rank_0_blamed, hf_spec, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
ENDED = {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}


def test_hf_trainer_rank_0_stopped_on_slurm_is_blamed(streb, tmp_path: Path) -> None:
    needs("transformers")
    needs_program("py-spy")
    spec = (
        hf_spec(tmp_path, "nodes: 2\n")
        .read_text()
        .replace("procs_per_node: 2", "procs_per_node: 1")
    )
    (tmp_path / "job.yaml").write_text(spec)
    res = streb("run", str(tmp_path / "job.yaml"), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    st = status(streb)
    wait_ready(streb, Path(st["run_dir"]))
    out = streb("fault", st["id"], "hang-rank", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    st = wait_for(streb, st["id"], ENDED, timeout=180)
    run_dir = Path(st["run_dir"])
    print((run_dir / "batch.log").read_text()[-3000:])
    recs = records(run_dir)
    assert [recs[f"rank-{r}"]["host"] for r in range(2)] == ["tn1", "tn2"], recs
    diag = assert_rank_0_blamed(streb, st)
    assert "stopped (SIGSTOP or a debugger)" in diag, diag
    text = (run_dir / "attempt-0" / "stacks" / "rank-0.txt").read_text()
    assert "# host tn1" in text and "# state stopped" in text, text
    assert "_inner_training_loop" in text, text
