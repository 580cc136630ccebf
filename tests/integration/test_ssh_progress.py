"""Issue 27 over ssh (two real sshd hosts, the copy path: the agents' run directory is on
the hosts, so their progress.json stays there): `treb status --json` reads the progress
from the first rank's log that comes back, with the same parser (cli/progress.py)."""

# ruff: noqa: F811 (the ssh_config fixture, imported, is named as an argument)
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import needs, status_json
from tests.integration.test_progress import TQDM_JOB, wait_until
from tests.integration.test_ssh_runs import PY, assert_nothing_left, spec, ssh_config  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.ssh]


def test_tqdm_progress_over_ssh_from_the_log_that_comes_back(treb, tmp_path: Path,
                                                              ssh_config: str) -> None:  # fmt: skip
    needs("tqdm")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "job.py").write_text(TQDM_JOB)
    path = spec(tmp_path, ssh_config, f"{PY} job.py 300 0.1")
    res = treb("run", str(path), "--on", "ssh", "--detach")
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:

        def midway() -> dict | None:
            p = status_json(treb, run)["progress"]
            return p if p and p["rate"] and 0.05 < p["fraction"] < 0.9 else None

        p = wait_until("a reading midway", midway, timeout=180)
        assert p["total"] == 300 and 0 < p["step"] < 300 and p["eta_s"] > 0
        assert not (Path(status_json(treb, run)["run_dir"]) / "progress.json").exists()
    finally:
        treb("cancel", run)
    assert_nothing_left(run)
