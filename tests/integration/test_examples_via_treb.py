"""The shipped examples through `treb run`: real DDP training and the contract checker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, needs_program, status_json

pytestmark = pytest.mark.integration
DIGITS = REPO / "examples" / "digits-ddp" / "job.yaml"
HELLO = REPO / "examples" / "hello" / "job.yaml"


@pytest.mark.parametrize(
    "launcher,nodes", [("native", 1), ("native", 2), ("torchrun", 1), ("torchrun", 2)]
)
def test_digits_ddp_trains(launcher: str, nodes: int, treb) -> None:
    needs("torch")
    needs("sklearn")
    res = treb("run", str(DIGITS), "-o", f"launcher={launcher}", "-o", f"nodes={nodes}",
               "-o", "command=python train.py --epochs 8", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    acc = re.search(r"^\[0:0\] accuracy: ([0-9.]+)$", res.stdout, re.M)
    assert acc and float(acc.group(1)) > 0.9, res.stdout[-2000:]
    assert re.search(r"^\[0:0\] performance: [0-9.]+ samples_per_second$", res.stdout, re.M)
    assert re.search(r"^\[0:0\] epoch 8 loss [0-9.]+$", res.stdout, re.M)
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED" and st["shape"] == f"{nodes}x2"
    run_dir = Path(st["run_dir"])
    for rank in range(nodes * 2):
        assert (run_dir / "attempt-0" / f"rank-{rank}.log").exists()
    assert "accuracy:" in (run_dir / "attempt-0" / "rank-0.log").read_text()


@pytest.mark.parametrize("launcher", ["native", "none", "torchrun", "mpirun"])
def test_hello_checks_the_contract_and_talks_over_master_port(launcher: str, treb) -> None:
    if launcher == "torchrun":
        needs("torch")
    if launcher == "mpirun":
        needs_program("mpirun")
    res = treb("run", str(HELLO), "-o", f"launcher={launcher}", timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "CONTRACT FAIL" not in res.stdout + res.stderr
    world = 2 if launcher == "none" else 4
    assert f"all {world} ranks said hello" in res.stdout
