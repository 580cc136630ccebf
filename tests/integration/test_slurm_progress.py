"""Issue 27 on the real Slurm test cluster: a tqdm job's progress and ETA while it runs on
2 nodes (rank 0's agent, in its own srun task, records it in the shared run directory;
`treb status --json` and `treb ps` read it), and `treb logs --dedup` of its 4 ranks."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import needs, status_json, write_spec
from tests.integration.slurm_support import slurm, slurm_conf, streb  # noqa: F401 (fixtures)
from tests.integration.test_progress import TQDM_JOB, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_tqdm_progress_on_two_slurm_nodes(streb, tmp_path: Path) -> None:
    needs("tqdm")
    (tmp_path / "job.py").write_text(TQDM_JOB)
    spec = write_spec(tmp_path, "name: sbar\nnodes: 2\nprocs_per_node: 2\n"
                      "command: 'echo loading; python job.py 300 0.1'\n")  # fmt: skip
    res = streb("run", "-d", "--on", "slurm", str(spec))
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:

        def midway() -> dict | None:
            p = status_json(streb, run)["progress"]
            return p if p and p["rate"] and 0.05 < p["fraction"] < 0.9 else None

        p = wait_until("a reading midway", midway, timeout=240)
        assert p["total"] == 300 and 0 < p["step"] < 300 and p["eta_s"] > 0
        assert (Path(status_json(streb, run)["run_dir"]) / "progress.json").is_file()
        ps = streb("ps").stdout
        assert re.search(rf"^{run} .* \d+% \d+/300\s+\S+$", ps, re.M), ps
        wait_until("every rank's first line", lambda: streb("logs", run, "--dedup").stdout
                   .startswith("[0-3] loading\n"))  # fmt: skip
    finally:
        streb("cancel", run)
