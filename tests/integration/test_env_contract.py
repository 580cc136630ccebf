"""Every field of the per-rank environment contract, checked from inside real ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, status_json, write_spec

pytestmark = pytest.mark.integration
SCRIPT = REPO / "tests" / "integration" / "scripts" / "dump_env.py"


def _envs(run_dir: Path) -> dict[str, dict]:
    return {
        p.stem.removesuffix(".json"): json.loads(p.read_text())
        for p in (run_dir / "env").glob("*.json")
    }


def test_native_contract_two_simulated_nodes(treb, tmp_path: Path) -> None:
    text = f"command: [python, {SCRIPT}, a b, '$RANK']\nnodes: 2\nprocs_per_node: 2\n"
    spec = write_spec(tmp_path, text + "env:\n  EXTRA: from-spec\n")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    run_dir = Path(st["run_dir"])
    envs = _envs(run_dir)
    assert sorted(envs) == ["0", "1", "2", "3"]
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(ports) == 1 and 1024 <= int(ports.pop()) <= 65535
    for r, e in envs.items():
        rank = int(r)
        assert e["RANK"] == str(rank) and e["ROLE_RANK"] == str(rank)
        assert e["LOCAL_RANK"] == str(rank % 2)
        assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["NODE_RANK"] == e["GROUP_RANK"] == str(rank // 2)
        assert e["NUM_NODES"] == "2" and e["GROUP_WORLD_SIZE"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["TREB_RUN_ID"] == st["id"] and e["TREB_RUN_DIR"] == str(run_dir)
        assert e["TREB_ATTEMPT"] == "0"
        assert e["TREB_CHECKPOINT_DIR"] == str(run_dir / "checkpoints")
        assert e["PYTHONUNBUFFERED"] == "1"
        expected_omp = max(1, len(os.sched_getaffinity(0)) // 4)
        assert e["OMP_NUM_THREADS"] == str(expected_omp)
        assert e["EXTRA"] == "from-spec"
        assert e["_argv"] == ["a b", "$RANK"]  # a list command is not expanded by any shell
        assert e["_cwd"] == e["TREB_CODE_DIR"] == str(run_dir / "code")  # the snapshot
        assert "TREB_HOME" in e  # the submitting environment is inherited


def test_spec_omp_num_threads_wins(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"command: python {SCRIPT}\nenv:\n  OMP_NUM_THREADS: 7\n")
    assert treb("run", str(spec)).returncode == 0
    assert _envs(Path(status_json(treb)["run_dir"]))["0"]["OMP_NUM_THREADS"] == "7"


def test_none_launcher_once_per_node(treb, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, f"command: python {SCRIPT}\nlauncher: none\nnodes: 3\nprocs_per_node: 4\n"
    )
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    envs = _envs(Path(status_json(treb)["run_dir"]))
    assert sorted(envs) == ["node0", "node1", "node2"]
    for n, e in enumerate(envs[f"node{i}"] for i in range(3)):
        assert e["NODE_RANK"] == str(n) and e["NUM_NODES"] == "3" and e["LOCAL_WORLD_SIZE"] == "4"
        assert e["MASTER_ADDR"] == "127.0.0.1" and int(e["MASTER_PORT"]) > 0
        assert e["TREB_ATTEMPT"] == "0" and "TREB_RUN_ID" in e and "TREB_CHECKPOINT_DIR" in e
        assert "RANK" not in e and "WORLD_SIZE" not in e


def test_torchrun_launcher_sets_rank_vars_and_per_rank_logs(treb, tmp_path: Path) -> None:
    needs("torch")
    spec = write_spec(
        tmp_path, f"command: python {SCRIPT}\nlauncher: torchrun\nnodes: 2\nprocs_per_node: 2\n"
    )
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr + res.stdout
    st = status_json(treb)
    run_dir = Path(st["run_dir"])
    envs = _envs(run_dir)
    assert sorted(envs) == ["0", "1", "2", "3"]
    for r, e in envs.items():
        assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["LOCAL_RANK"] == str(int(r) % 2) and e["GROUP_RANK"] == str(int(r) // 2)
        assert e["TREB_RUN_ID"] == st["id"] and e["TREB_ATTEMPT"] == "0"
    for r in range(4):  # each worker's output lands in its own file
        assert f"dumped {r}" in (run_dir / "attempt-0" / f"rank-{r}.log").read_text()
    # one agent per node, and each worker's own outcome (recorded by its wrapper)
    labels = {p["label"]: p for p in st["procs"]}
    assert set(labels) == {"0", "1", "0:0", "0:1", "1:0", "1:1"}, st["procs"]
    assert [labels[f"{r // 2}:{r % 2}"]["rank"] for r in range(4)] == [0, 1, 2, 3]
    assert all(p["exit_code"] == 0 and not p["stopped_by_launcher"] for p in st["procs"])
