"""64 ranks on 8 nodes of the test cluster (partition `big`): `treb run --on slurm` at scale.

Why: a launcher that works for 2 x 2 ranks can still lose ranks, mix up rank numbers or
place them wrongly at 8 x 8 (hostlists of 8 nodes, 64 records written at once over the
shared filesystem, 64 logs); a TCP ring over all ranks proves each one started with its
own RANK on the right node and could reach the next one over the network.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    big_partition,
    records,
    slurm_conf,
    status,
    streb,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
RING = REPO / "tests" / "integration" / "scripts" / "ring.py"


def test_64_rank_ring_on_8_nodes(streb, big_partition: str, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"name: ring64\ncommand: '{sys.executable} {RING}'\nnodes: 8\n"
                                f"procs_per_node: 8\nslurm:\n  partition: {big_partition}\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert (st["state"], st["shape"], st["exit_code"]) == ("SUCCEEDED", "8x8", 0), st
    procs = {p["rank"]: p for p in st["procs"]}
    assert sorted(procs) == list(range(64)), sorted(procs)
    assert all(p["exit_code"] == 0 for p in procs.values()), st["procs"]
    recs = records(st["run_dir"])
    hosts = [recs[f"rank-{r}"]["host"] for r in range(64)]
    # 8 ranks on each of the 8 nodes, in node order (block distribution).
    assert Counter(hosts) == {f"tn{n}": 8 for n in range(1, 9)}, hosts
    assert hosts == [f"tn{r // 8 + 1}" for r in range(64)], hosts
    for r in range(1, 64):  # each rank got the token from the one before and passed it on
        log = Path(procs[r]["log"]).read_text()
        want = f"rank {r} on {hosts[r]}: token from rank {r - 1} passed to rank {(r + 1) % 64}\n"
        assert log == want, (r, log)
    log0 = Path(procs[0]["log"]).read_text()
    assert log0 == "rank 0 on tn1: token went around 64 ranks on 8 hosts\n", log0
    assert re.search(r"^\[7:7\] rank 63 on tn8: token from rank 62", res.stdout, re.M)
