"""Sweeps on the real 2-node test cluster: one job array for all points, results grouped.

Why: `--array` with a `%` limit, array task ids in squeue (`<job>_<task>`) and cancelling
an array (pending tasks included) are only known to work where a real slurmctld runs them.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    records,
    slurm,
    slurm_conf,
    status,
    streb,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def _tasks(job: str) -> dict[str, str]:
    """squeue's view of the array: {"<job>_<task>": state}."""
    q = slurm("squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i|%T")
    assert q.returncode == 0, q.stderr
    return dict(line.split("|") for line in q.stdout.split())


def _ps(treb) -> list[dict]:
    res = treb("ps", "--json")
    assert res.returncode == 0, res.stderr
    return sorted(json.loads(res.stdout), key=lambda r: r["backend_id"] or "")


def test_four_point_sweep_is_one_array_job(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: swept\ncommand: 'sleep 2; echo lr=$LR bs=$BS rank=$RANK'"
                                "\nprocs_per_node: 2\nsweep_parallel: 2\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--sweep", "-o", "env.LR=1,2", "-o", "env.BS=3,4",
                timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "4 of 4 runs succeeded" in res.stderr and "Slurm job array" in res.stderr
    runs = _ps(streb)
    assert len(runs) == 4 and len({r["sweep_id"] for r in runs}) == 1
    job = runs[0]["backend_id"].split("_")[0]
    assert [r["backend_id"] for r in runs] == [f"{job}_{i}" for i in range(4)]  # one job id
    assert _tasks(job) == {f"{job}_{i}": "COMPLETED" for i in range(4)}
    assert "ArrayTaskThrottle=2" in slurm("scontrol", "show", "job", job).stdout
    for r in runs:  # each array task ran its own point, its output in its own run dir
        p = json.loads(r["params"])
        assert r["state"] == "SUCCEEDED" and r["exit_code"] == 0
        for rank in (0, 1):
            log = (Path(r["run_dir"]) / "attempt-0" / f"rank-{rank}.log").read_text()
            assert log == f"lr={p['env.LR']} bs={p['env.BS']} rank={rank}\n"
        assert f"run {r['id']}: SUCCEEDED" in (Path(r["run_dir"]) / "batch.log").read_text()
        assert f"[{runs.index(r)}|0:1] lr={p['env.LR']} bs={p['env.BS']} rank=1" in res.stdout
    spans = []
    for r in runs:
        rec = records(r["run_dir"])["rank-0"]
        spans.append((rec["started_at"], rec["ended_at"]))
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most <= 2, spans  # the % limit of the array
    sweep_id = runs[0]["sweep_id"]
    st = status(streb, sweep_id)
    assert [r["state"] for r in st["runs"]] == ["SUCCEEDED"] * 4
    assert "4 SUCCEEDED" in streb("status", sweep_id).stdout


def test_cancel_a_sweep_cancels_the_array(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: long\ncommand: 'echo up; sleep 600'\nsweep_parallel: 2\n")
    res = streb("run", str(spec), "--on", "slurm", "--sweep", "-o", "env.A=1,2,3,4", "--detach")
    assert res.returncode == 0, res.stderr
    sweep_id = res.stdout.strip()
    deadline = time.monotonic() + 90
    while True:  # two points running (the % limit), two still queued
        runs = _ps(streb)
        running = [r for r in runs if r["state"] == "RUNNING" and records(r["run_dir"])]
        if len(running) == 2:
            break
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    assert sorted(r["state"] for r in runs) == ["PENDING", "PENDING", "RUNNING", "RUNNING"]
    job = runs[0]["backend_id"].split("_")[0]
    res = streb("cancel", sweep_id)
    assert res.returncode == 0, res.stderr
    assert f"sweep {sweep_id}: 4 of 4 runs stopped (4 CANCELLED)" in res.stdout, res.stdout
    runs = _ps(streb)
    assert [r["state"] for r in runs] == ["CANCELLED"] * 4
    for r in runs:
        if records(r["run_dir"]):  # the two that ran: stopped by treb cancel
            assert status(streb, r["id"])["attempts"][0]["state"] == "CANCELLED"
    time.sleep(2)
    tasks = _tasks(job)
    assert tasks and set(tasks.values()) == {"CANCELLED"}, tasks  # nothing left to start
    assert not any((Path(r["run_dir"]) / "attempt-0").exists() for r in runs
                   if r["id"] not in {x["id"] for x in running})  # fmt: skip


def test_ctrl_c_on_an_attached_sweep_cancels_the_array(streb, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, "name: attached\ncommand: 'echo up; sleep 600'\nsweep_parallel: 2\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "slurm", "--sweep", "-o", "env.A=1,2,3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            time.sleep(0.5)
            home = Path(os.environ["TREB_HOME"])
            runs = _ps(streb) if (home / "runs.db").exists() else []
            if sum(1 for r in runs if r["state"] == "RUNNING" and records(r["run_dir"])) == 2:
                break
            assert time.monotonic() < deadline, runs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "[0|0:0] up" in out and "cancelling Slurm job array" in err
    runs = _ps(streb)
    assert [r["state"] for r in runs] == ["CANCELLED"] * 3, runs
    time.sleep(2)
    tasks = _tasks(runs[0]["backend_id"].split("_")[0])
    assert tasks and set(tasks.values()) == {"CANCELLED"}, tasks


def test_sweep_in_a_venv(streb, treb_home: Path, tmp_path: Path) -> None:
    """The environment is built (once) before the array is submitted; every point uses it."""
    (tmp_path / "probe.py").write_text(
        "import os, six, sys\nprint('x', os.environ['X'], sys.prefix)\n"
    )
    spec = write_spec(
        tmp_path,
        "name: envsweep\ncommand: python probe.py\nenvironment:\n  requirements: [six==1.16.0]\n",
    )
    res = streb(
        "run", str(spec), "--on", "slurm", "--no-check", "--sweep", "-o", "env.X=1,2", timeout=600
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    prefix = treb_home / "envs" / "envsweep"
    assert f"[0|0:0] x 1 {prefix}" in res.stdout and f"[1|0:0] x 2 {prefix}" in res.stdout
    assert [r["state"] for r in _ps(streb)] == ["SUCCEEDED"] * 2
