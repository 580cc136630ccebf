"""trebuchet.dist.init_env: rank variables from Slurm, Open MPI, PMI and SkyPilot.

Why: a script started by srun/mpirun/SkyPilot directly must find the same RANK, WORLD_SIZE,
MASTER_ADDR... as under trebuchet's launcher, and must never lose what was already set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import needs
from trebuchet import dist

ROOT = Path(__file__).resolve().parents[2]
OUTPUTS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NUM_NODES",
    "MASTER_ADDR",
    "MASTER_PORT",
)
SOURCE_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MPI_", "SKYPILOT_")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start from no rank variables at all (the test runner may itself run under Slurm), and
    put os.environ back afterwards: init_env writes to it directly."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name in OUTPUTS or name.startswith(SOURCE_PREFIXES):
            monkeypatch.delenv(name)
    yield
    os.environ.clear()
    os.environ.update(saved)


def setenv(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(
        monkeypatch,
        SLURM_PROCID="5",
        SLURM_NTASKS="8",
        SLURM_LOCALID="1",
        SLURM_NODEID="2",
        SLURM_TASKS_PER_NODE="2(x4)",
        SLURM_JOB_NUM_NODES="4",
        SLURM_JOB_ID="4123456",
        SLURM_JOB_NODELIST="nodeA,nodeB[1-3]",
    )
    assert dist.init_env() == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "2",
        "GROUP_RANK": "2",
        "NUM_NODES": "4",
        "MASTER_ADDR": "nodeA",
        "MASTER_PORT": "18456",
    }
    assert os.environ["RANK"] == "5" and os.environ["MASTER_ADDR"] == "nodeA"


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("tn[1-2]", "tn1"),
        ("nodeA,nodeB[1-3]", "nodeA"),
        ("gpu[007-009,012]", "gpu007"),
        ("rack[2-3]n[05-06]", "rack2n05"),
        ("login", "login"),
    ],
)
def test_slurm_nodelist_first_host(
    monkeypatch: pytest.MonkeyPatch, nodelist: str, first: str
) -> None:
    setenv(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_NODELIST=nodelist)
    assert dist.init_env()["MASTER_ADDR"] == first


@pytest.mark.parametrize(
    "expr", ["tn[1-2]", "nodeA,nodeB[1-3]", "gpu[007-009,12],x", "a[1-2]b[3-4]-ib,c"]
)
def test_builtin_expansion_matches_python_hostlist(expr: str) -> None:
    hostlist = needs("hostlist")
    assert dist._expand_builtin(expr) == hostlist.expand_hostlist(expr)


def test_hostlist_expansion() -> None:
    assert dist.expand_hostlist("nodeA,nodeB[1-3]") == ["nodeA", "nodeB1", "nodeB2", "nodeB3"]
    assert dist.expand_hostlist("tn[1-2]") == ["tn1", "tn2"]


def test_scontrol_fallback_without_python_hostlist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "hostlist", None)  # makes `import hostlist` fail
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] || exit 1\n"
        "printf 'fromscontrol1\\nfromscontrol2\\n'\n"
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert dist.expand_hostlist("whatever[1-2]") == ["fromscontrol1", "fromscontrol2"]


def test_builtin_fallback_without_hostlist_or_scontrol(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "hostlist", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol here
    assert dist.expand_hostlist("tn[1-2]") == ["tn1", "tn2"]


@pytest.mark.parametrize(
    ("tasks_per_node", "node_id", "expected"),
    [
        ("4", "0", "4"),
        ("2(x3)", "2", "2"),
        ("3(x2),1", "2", "1"),
        ("3(x2),1", "0", "3"),
    ],
)
def test_slurm_tasks_per_node(
    monkeypatch: pytest.MonkeyPatch, tasks_per_node: str, node_id: str, expected: str
) -> None:
    setenv(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_NTASKS="7",
        SLURM_NODEID=node_id,
        SLURM_TASKS_PER_NODE=tasks_per_node,
    )
    assert dist.init_env()["LOCAL_WORLD_SIZE"] == expected


def test_slurm_ntasks_per_node_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(
        monkeypatch,
        SLURM_PROCID="0",
        SLURM_NTASKS="8",
        SLURM_NTASKS_PER_NODE="4",
        SLURM_TASKS_PER_NODE="5(x2)",
    )
    assert dist.init_env()["LOCAL_WORLD_SIZE"] == "4"


@pytest.mark.parametrize(
    ("job_id", "port"), [("7", 15007), ("123456789", 21789), ("10000", 15000), ("9999", 24999)]
)
def test_slurm_master_port(monkeypatch: pytest.MonkeyPatch, job_id: str, port: int) -> None:
    setenv(monkeypatch, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_JOB_ID=job_id)
    assert dist.init_env()["MASTER_PORT"] == str(port)
    assert 15000 <= port <= 24999


def test_open_mpi_single_node(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(
        monkeypatch,
        OMPI_COMM_WORLD_RANK="2",
        OMPI_COMM_WORLD_SIZE="4",
        OMPI_COMM_WORLD_LOCAL_RANK="2",
        OMPI_COMM_WORLD_LOCAL_SIZE="4",
    )
    assert dist.init_env() == {
        "RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "0",
        "GROUP_RANK": "0",
        "NUM_NODES": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }


def test_open_mpi_inside_slurm_job_prefers_mpi_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    # mpirun in an sbatch script: SLURM_PROCID describes mpirun's daemon, not the rank.
    setenv(
        monkeypatch,
        OMPI_COMM_WORLD_RANK="5",
        OMPI_COMM_WORLD_SIZE="8",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        OMPI_COMM_WORLD_LOCAL_SIZE="4",
        SLURM_PROCID="1",
        SLURM_NTASKS="2",
        SLURM_JOB_ID="77",
        SLURM_JOB_NODELIST="tn[1-2]",
    )
    env = dist.init_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert (env["NODE_RANK"], env["NUM_NODES"]) == ("1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("tn1", "15077")


def test_open_mpi_multi_node_without_hosts_leaves_master_addr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setenv(
        monkeypatch,
        OMPI_COMM_WORLD_RANK="3",
        OMPI_COMM_WORLD_SIZE="4",
        OMPI_COMM_WORLD_LOCAL_RANK="1",
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
    )
    env = dist.init_env()
    assert env["RANK"] == "3" and env["NODE_RANK"] == "1"
    assert "MASTER_ADDR" not in env and "MASTER_ADDR" not in os.environ


def test_pmi(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(monkeypatch, PMI_RANK="1", PMI_SIZE="2", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2")
    env = dist.init_env()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("1", "2", "1")
    assert env["LOCAL_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"


def test_srun_started_mpi_tasks_use_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    # srun --mpi=pmi2: PMI_RANK == SLURM_PROCID, and only Slurm knows the local layout.
    setenv(
        monkeypatch,
        PMI_RANK="3",
        PMI_SIZE="4",
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_LOCALID="1",
        SLURM_NODEID="1",
        SLURM_TASKS_PER_NODE="2(x2)",
        SLURM_JOB_NODELIST="tn[1-2]",
        SLURM_JOB_ID="42",
    )
    env = dist.init_env()
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("3", "1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("tn1", "15042")


def test_skypilot_one_gpu_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(
        monkeypatch,
        SKYPILOT_NODE_RANK="1",
        SKYPILOT_NUM_NODES="2",
        SKYPILOT_NODE_IPS="10.0.0.5\n10.0.0.6\n",
        SKYPILOT_NUM_GPUS_PER_NODE="1",
    )
    assert dist.init_env() == {
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "NUM_NODES": "2",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
    }


def test_skypilot_several_gpus_per_node_sets_node_level_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    setenv(
        monkeypatch,
        SKYPILOT_NODE_RANK="0",
        SKYPILOT_NUM_NODES="2",
        SKYPILOT_NODE_IPS="10.0.0.5\n10.0.0.6",
        SKYPILOT_NUM_GPUS_PER_NODE="8",
    )
    env = dist.init_env()
    assert env["LOCAL_WORLD_SIZE"] == "8" and env["MASTER_ADDR"] == "10.0.0.5"
    assert "RANK" not in env and "RANK" not in os.environ


def test_never_overwrites(monkeypatch: pytest.MonkeyPatch) -> None:
    setenv(
        monkeypatch,
        SLURM_PROCID="5",
        SLURM_NTASKS="8",
        SLURM_LOCALID="1",
        SLURM_JOB_ID="1234",
        SLURM_JOB_NODELIST="tn[1-2]",
        RANK="0",
        MASTER_ADDR="chosen-host",
        MASTER_PORT="1234",
    )
    env = dist.init_env()
    assert "RANK" not in env and "MASTER_ADDR" not in env and "MASTER_PORT" not in env
    assert (os.environ["RANK"], os.environ["MASTER_ADDR"]) == ("0", "chosen-host")
    assert os.environ["MASTER_PORT"] == "1234"
    assert env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert dist.init_env() == {}  # idempotent: everything is set now


def test_nothing_to_do() -> None:
    before = dict(os.environ)
    assert dist.init_env() == {}
    assert dict(os.environ) == before


def test_import_is_light() -> None:
    """Importing trebuchet.dist must not pull torch in (it runs before torch in user code)."""
    code = (
        "import sys, trebuchet.dist; heavy = {'torch', 'numpy', 'hostlist'} & set(sys.modules);"
        " assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=60)


def test_in_subprocess_like_srun() -> None:
    """End to end in a fresh interpreter, as a script started by srun would call it."""
    code = (
        "import os, trebuchet.dist as d; d.init_env();"
        " print(os.environ['RANK'], os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in OUTPUTS}
    env.update(
        PYTHONPATH=str(ROOT),
        SLURM_PROCID="3",
        SLURM_NTASKS="4",
        SLURM_JOB_NODELIST="nodeA,nodeB[1-3]",
        SLURM_JOB_ID="31337",
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.split() == ["3", "nodeA", "16337"]


def test_builtin_expansion_of_brackets_that_hold_no_range_gives_no_name() -> None:
    """What python-hostlist refuses (BadHostlist) gives the fallback no name to start a rank
    on; it raised ValueError before (`int('a')`)."""
    assert dist._expand_builtin("tn[a-b],tn1") == ["tn1"]
    assert dist._expand_builtin("tn[3-1]") == []
