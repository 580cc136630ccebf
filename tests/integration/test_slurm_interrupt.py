# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
"""Ctrl+C on an attached `treb run --on slurm`, and the environment the job's ranks see, on
the real 2-node test cluster (issue 35).

- Ctrl+C reaches the ranks as torchrun and the local and ssh engines deliver it: SIGINT
  (a Python rank's `except KeyboardInterrupt:` saves its checkpoint), SIGTERM to what still
  runs after the grace period, SIGKILL after another; the run ends CANCELLED, exit 130.
- Ctrl+C while a retry is pending: CANCELLED after the failed attempt, never "nothing failed".
- A `python3` that is a pyenv-style shim (first on PATH through slurm.setup) does not change
  the environment the ranks see: theirs is the one the job's script made.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import TrebFn, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    slurm_conf,
    slurm_state,
    status,
    streb,
)
from tests.integration.test_interrupt import RANK_PY, interrupt

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def _argv(spec: Path) -> list[str]:
    return [sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "slurm"]


def test_ctrl_c_is_keyboard_interrupt_then_term_then_kill(streb: TrebFn, tmp_path: Path) -> None:
    """2 nodes x 2 ranks: each rank gets SIGINT once (ranks 0 and 2 save their checkpoint),
    SIGTERM after the grace period ends rank 1, SIGKILL after another ends rank 3 (both
    shrug KeyboardInterrupt off); the run is CANCELLED with no first failure, every rank
    stopped by the launcher; exit 130."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "rank.py").write_text(RANK_PY)
    spec = write_spec(tmp_path, f"name: interrupted\ncommand: OUT={out} exec python rank.py\n"
                                "nodes: 2\nprocs_per_node: 2\ngrace_period: 2s\n"
                                "env: {STUBBORN: '1,3'}\n")  # fmt: skip
    code, said = interrupt(_argv(spec), lambda: len(list(out.glob("up-*"))) == 4, tmp_path)
    assert code == 130, said
    assert "interrupted: SIGINT to the ranks" in said, said
    for rank in (0, 2):
        assert (out / f"saved-{rank}").read_text() == "checkpoint at interrupt\n"
        assert (out / f"signals-{rank}").read_text() == "SIGINT\n"  # once: no SIGTERM
    assert (out / "signals-1").read_text() == "SIGINT\nSIGTERM\n"
    assert (out / "signals-3").read_text() == "SIGINT\nSIGTERM\n"
    st = status(streb)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None, st
    assert slurm_state(st["backend_id"]) == "CANCELLED", st  # as scancel's, not FAILED (130)
    by_rank = {p["rank"]: p for p in st["procs"]}
    assert [by_rank[r]["signal"] for r in (0, 2)] == ["SIGINT", "SIGINT"], by_rank
    assert by_rank[1]["exit_code"] == 143 and by_rank[3]["signal"] == "SIGKILL", by_rank
    assert all(p["stopped_by_launcher"] for p in st["procs"]), st["procs"]


def test_ctrl_c_while_a_retry_is_pending(streb: TrebFn, tmp_path: Path) -> None:
    """Attempt 1 fails on both nodes; Ctrl+C while attempt 2's `pre` runs (no rank started):
    CANCELLED after attempt 1 failed, its cause kept; exit 130."""
    gap = tmp_path / "in-gap"
    spec = write_spec(tmp_path, (
        "name: gap\nnodes: 2\nretries: 1\n"
        "command: 'if [ \"$TREB_ATTEMPT\" = 0 ]; then exit 3; fi; sleep 60'\n"
        f"pre: 'if [ \"$TREB_ATTEMPT\" = 1 ]; then touch {gap}; sleep 60; fi'\n"
    ))  # fmt: skip
    code, said = interrupt(_argv(spec), gap.exists, tmp_path)
    assert code == 130, said
    assert "nothing failed" not in said.lower(), said
    assert "cancelled after attempt 1 failed" in said, said
    st = status(streb)
    assert st["state"] == "CANCELLED", st
    assert st["first_failure"]["attempt"] == 0 and st["first_failure"]["exit_code"] == 3, st
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "CANCELLED"], st["attempts"]
    assert st["attempts"][1]["reason"].startswith("cancelled after attempt 1 failed"), st


def test_ranks_see_the_setup_environment_past_a_pyenv_shim(streb: TrebFn, tmp_path: Path) -> None:
    """slurm.setup puts a pyenv-style `python3` shim first on PATH (it prepends a folder of
    its own and sets a variable, then runs the real interpreter): the controller and the
    node agents start through it, yet every rank sees PATH and the variables as setup made
    them, none of the shim's."""
    shim = tmp_path / "shims"
    shim.mkdir()
    (shim / "python3").write_text(
        "#!/bin/sh\nPATH=/opt/shim-versions/bin:$PATH SHIMMED=1; export PATH SHIMMED\n"
        f'exec {sys.executable} "$@"\n'
    )
    (shim / "python3").chmod(0o755)
    spec = write_spec(tmp_path, (
        "name: shimmed\nnodes: 2\nprocs_per_node: 2\n"
        "command: 'echo \"path=$PATH shimmed=${SHIMMED:-no} made=${MADE_BY_SETUP:-no}\"'\n"
        f"slurm:\n  setup: ['export PATH={shim}:$PATH MADE_BY_SETUP=1']\n"
    ))  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run_dir = Path(status(streb)["run_dir"])
    for rank in range(4):
        line = (run_dir / "attempt-0" / f"rank-{rank}.log").read_text().strip()
        path = line.removeprefix("path=").split(" ")[0].split(":")
        # treb's own folder first (its scontrol, for a rank's requeue), then setup's PATH
        assert path[0] == str(run_dir / "bin") and path[1] == str(shim), line
        assert "/opt/shim-versions/bin" not in path and "shimmed=no made=1" in line, line
