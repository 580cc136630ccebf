"""Sweeps on the local backend: the cross product as runs grouped under one sweep id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec

pytestmark = pytest.mark.integration
CMD = "command: 'echo lr=$LR bs=$BS rank=$RANK'\nprocs_per_node: 2\n"


def test_override_sweep_runs_the_cross_product(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, CMD)
    res = treb("run", str(spec), "--sweep", "-o", "env.LR=0.1,0.01", "-o", "env.BS=32,64")
    assert res.returncode == 0, res.stderr
    assert "sweep s" in res.stderr and "4 of 4 runs succeeded" in res.stderr
    assert "env.LR=0.1 env.BS=32" in res.stderr and "{'" not in res.stderr  # no Python dicts
    runs = json.loads(treb("ps", "--json").stdout)
    assert len(runs) == 4 and len({r["sweep_id"] for r in runs}) == 1
    params = sorted(
        (json.loads(r["params"])["env.LR"], json.loads(r["params"])["env.BS"]) for r in runs
    )
    assert params == [("0.01", "32"), ("0.01", "64"), ("0.1", "32"), ("0.1", "64")]
    for r in runs:  # each run got its own point
        p = json.loads(r["params"])
        log = (Path(r["run_dir"]) / "attempt-0" / "rank-1.log").read_text()
        assert log == f"lr={p['env.LR']} bs={p['env.BS']} rank=1\n"
    sweep_id = runs[0]["sweep_id"]
    st = json.loads(treb("status", sweep_id[:4], "--json").stdout)
    assert st["sweep_id"] == sweep_id and [r["state"] for r in st["runs"]] == ["SUCCEEDED"] * 4
    table = treb("status", sweep_id).stdout
    assert "env.BS" in table and "env.LR" in table and "4 SUCCEEDED" in table
    res = treb("cancel", sweep_id)  # nothing left to cancel: it says so
    assert res.returncode == 0 and res.stdout == f"sweep {sweep_id} already ended: 4 SUCCEEDED\n"


def test_sweep_block_and_parallel_limit(treb, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "command: 'sleep 0.5; echo $LR'\nsweep:\n  env.LR: [1, 2, 3, 4]\nsweep_parallel: 2\n",
    )
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    runs = json.loads(treb("ps", "--json").stdout)
    spans = [(r["started_at"], r["ended_at"]) for r in runs]
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert len(runs) == 4 and most <= 2


def test_escaped_comma_is_not_a_sweep(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo $X'\n")
    res = treb("run", str(spec), "--sweep", "-o", "env.X=a\\,b")
    assert res.returncode == 0 and res.stdout.strip() == "[0:0] a,b"
    assert json.loads(treb("ps", "--json").stdout)[0]["sweep_id"] is None


def test_a_comma_without_sweep_is_part_of_the_value(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo \"$NCCL_IB_HCA\"'\n")
    res = treb("run", str(spec), "-o", "env.NCCL_IB_HCA=mlx5_0,mlx5_1")
    assert res.returncode == 0 and res.stdout.strip() == "[0:0] mlx5_0,mlx5_1", res.stderr
    runs = json.loads(treb("ps", "--json").stdout)
    assert len(runs) == 1 and runs[0]["sweep_id"] is None


def test_a_bad_point_fails_the_whole_sweep_before_anything_runs(
    treb, treb_home: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, CMD)
    res = treb("run", str(spec), "--sweep", "-o", "nodes=1,two")
    assert (
        res.returncode == 2
        and "-o nodes=two: nodes: must be an integer between 1 and 100000" in res.stderr
    )
    assert json.loads(treb("ps", "--json").stdout) == []


def test_detached_sweep_can_be_cancelled(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'sleep 30'\n")
    res = treb("run", str(spec), "--multirun", "-o", "env.A=1,2,3", "--detach")
    assert res.returncode == 0, res.stderr
    sweep_id = res.stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [r["state"] for r in json.loads(treb("ps", "--json").stdout)]
        if "RUNNING" in states:
            break
        time.sleep(0.1)
    res = treb("cancel", sweep_id)
    assert res.returncode == 0 and f"sweep {sweep_id}: 3 of 3 runs stopped" in res.stdout
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = [r["state"] for r in json.loads(treb("ps", "--json").stdout)]
        if all(s == "CANCELLED" for s in states):
            break
        time.sleep(0.1)
    assert states == ["CANCELLED"] * 3
    again = treb("cancel", sweep_id).stdout
    assert again == f"sweep {sweep_id} already ended: 3 CANCELLED\n", again


def test_results_of_a_sweep_side_by_side(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo performance: $((LR * 10)) samples_per_second'\n")
    res = treb("run", str(spec), "--multirun", "-o", "env.LR=1,2,3")
    assert res.returncode == 0, res.stderr
    sweep_id = json.loads(treb("ps", "--json").stdout)[0]["sweep_id"]
    rows = json.loads(treb("results", sweep_id, "--json").stdout)
    got = sorted((r["params"]["env.LR"], r["performance"], r["sweep_id"]) for r in rows)
    assert got == [("1", 10.0, sweep_id), ("2", 20.0, sweep_id), ("3", 30.0, sweep_id)]
    table = treb("results", sweep_id).stdout
    assert "env.LR" in table.splitlines()[0] and len(table.splitlines()) == 4
