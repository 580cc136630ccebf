"""Issue 38 on the Slurm test cluster: the HuggingFace Trainer of transformers 5.25.0
(bars off, log_level info, as on clusters) on 2 nodes: its metrics, its results row and its
progress (the agents write them into the shared run directory)."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import needs
from tests.integration.slurm_support import slurm, slurm_conf, streb  # noqa: F401 (fixtures)
from tests.integration.test_trainers import check_trainer_run, ended, start, watch

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_transformers_5_on_two_slurm_nodes(streb, tmp_path: Path) -> None:
    needs("transformers")
    run = start(streb, tmp_path, "hf_train.py", "name: shf5\nnodes: 2\nprocs_per_node: 1\n"
                "command: python hf_train.py 40 --no-tqdm --save 10 --sleep 0.2\n", "--on",
                "slurm")  # fmt: skip
    check_trainer_run(streb, run, watch(streb, run, ended, timeout=240), 40)
