"""Stragglers on the Slurm test cluster: the batch step's job controller reads the ranks'
marks on the shared run directory, as the local supervisor does (test_stragglers.py): rank
1, alone on the second node, slowed by 50 %, is named within 20 steps with that node's name."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.slurm_support import records, slurm_conf, streb  # noqa: F401
from tests.integration.test_stragglers import slowed

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_a_slowed_rank_is_named_on_slurm(streb, tmp_path: Path) -> None:
    st = slowed(streb, tmp_path, "--on", "slurm", procs=1, nodes=2)
    host = records(st["run_dir"])["rank-1"]["host"]
    assert st["stragglers"]["stragglers"][0]["host"] == host
    assert st["stragglers"]["nodes"]["1"] >= 1.3 > st["stragglers"]["nodes"]["0"]
