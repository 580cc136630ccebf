"""Issue 38 on the Slurm test cluster: the HuggingFace Trainer of transformers 5.25.0
(bars off, log_level info, as on clusters) on 2 nodes: its metrics, its results row and its
progress (the agents write them into the shared run directory)."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import needs
from tests.integration.slurm_support import slurm, slurm_conf, streb  # noqa: F401 (fixtures)
from tests.integration.test_trainers import ended, job, metric, printed, result_row, watch

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_transformers_5_on_two_slurm_nodes(streb, tmp_path: Path) -> None:
    needs("transformers")
    spec = job(tmp_path, "hf_train.py", "name: shf5\nnodes: 2\nprocs_per_node: 1\n"
               "command: python hf_train.py 40 --no-tqdm --save 10 --sleep 0.2\n")  # fmt: skip
    res = streb("run", "-d", "--on", "slurm", str(spec))
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    seen = watch(streb, run, ended, timeout=240)
    assert seen[-1]["state"] == "SUCCEEDED", seen[-1]
    progress = [s["progress"] for s in seen if s["progress"]]
    assert progress and all(p["total"] == 40 for p in progress), progress  # never 1/1
    assert progress[-1]["step"] == 40
    log = (Path(seen[-1]["run_dir"]) / "attempt-0" / "rank-0.log").read_text()
    assert [v for _, v in metric(streb, run, "loss")] == printed(log, "loss")
    row = result_row(streb, run)
    assert row["status"] == "SUCCESS" and row["metric"] == "samples_per_second"
    assert row["performance"] == printed(log, "train_samples_per_second")[0]
