"""Environments and profiling on the real 2-node test cluster: a venv built on the
submitting host under TREB_HOME (shared with the nodes) is what every rank runs in, and
`profile: nsys` wraps the ranks there too (a stand-in nsys: no GPU stack exists here)."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import records, slurm_conf, status, streb  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def test_venv_on_both_nodes(streb, treb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(
        "import six, sys\nprint('six', six.__version__, sys.prefix)\n"
    )
    spec = write_spec(
        tmp_path,
        "name: envtest\ncommand: python probe.py\nnodes: 2\nenvironment:\n  requirements: [six==1.16.0]\n",
    )
    res = streb("run", str(spec), "--on", "slurm", "--no-check", timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    prefix = treb_home / "envs" / "envtest"
    assert res.stdout.count(f"six 1.16.0 {prefix}") == 2
    st = status(streb)
    assert {r["host"] for r in records(st["run_dir"]).values()} == {"tn1", "tn2"}
    again = streb("run", str(spec), "--on", "slurm", "--no-check", timeout=600)
    assert again.returncode == 0
    events = (Path(status(streb)["run_dir"]) / "events.jsonl").read_text()
    assert '"reused": true' in events


FAKE_NSYS = """#!/bin/bash
# Stand-in for `nsys profile ... -o OUT cmd...`: writes OUT.nsys-rep, runs cmd.
[ "$1" = profile ] || exit 2; shift
while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift 2;; --*) shift;; *) break;; esac; done
touch "$out.nsys-rep"
exec "$@"
"""


def test_nsys_profiles_ranks_on_both_nodes(streb, tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "nsys"
    exe.parent.mkdir()
    exe.write_text(FAKE_NSYS)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    spec = write_spec(
        tmp_path,
        "command: 'echo ran $RANK on $(hostname)'\nnodes: 2\nprocs_per_node: 2\nprofile: nsys\n",
    )
    env = {"PATH": f"{exe.parent}{os.pathsep}{os.environ['PATH']}"}  # sbatch exports PATH
    res = streb("run", str(spec), "--on", "slurm", "--no-check", env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run_dir = Path(status(streb)["run_dir"])
    reports = sorted(p.name for p in (run_dir / "profile" / "attempt-0").iterdir())
    assert reports == [f"rank-{r}.nsys-rep" for r in range(4)]


def test_queued_job_runs_the_code_as_submitted(streb, tmp_path: Path) -> None:
    """The job waits in the queue (--begin); the file is edited meanwhile; it runs the old code."""
    import time

    (tmp_path / "train.py").write_text("print('version one')\n")
    spec = write_spec(
        tmp_path, "command: python train.py\nslurm:\n  sbatch_args: ['--begin=now+4']\n"
    )
    res = streb("run", str(spec), "--on", "slurm", "--detach", "--no-check")
    assert res.returncode == 0, res.stderr
    (tmp_path / "train.py").write_text("print('version two')\n")
    deadline = time.monotonic() + 180
    while status(streb)["state"] not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
        time.sleep(1)
    assert status(streb)["state"] == "SUCCEEDED"
    assert streb("logs", "--rank", "0").stdout == "version one\n"
