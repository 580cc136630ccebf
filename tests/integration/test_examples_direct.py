"""The examples run correctly without trebuchet: under torchrun, and by hand with the env set.

Why: when `treb run examples/...` fails, these tell whether the example or the launcher is
to blame. Every process started here is ended here, by its own process group id.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits-ddp" / "train.py"
HELLO = ROOT / "examples" / "hello" / "hello.py"
# Variables a surrounding launcher (or a Slurm job running the tests) may have set, which
# would change what the examples see.
LEAKY = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NUM_NODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TREB_RUN_ID",
    "TREB_RUN_DIR",
    "TREB_ATTEMPT",
    "TREB_CHECKPOINT_DIR",
    "TORCHELASTIC_RUN_ID",
)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LEAKY}


def require(*modules: str) -> None:
    """Skip when the example's dependencies are absent, except in CI where that is a failure."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"missing {missing}: install examples/digits-ddp/requirements.txt")
    if missing:
        pytest.skip(f"missing {missing}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    # Own session: the whole tree (torchrun's workers too) can be ended by this group id.
    return subprocess.Popen(
        args,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    """Wait for proc; past the timeout kill its process group and fail the test."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, err = proc.communicate()
        pytest.fail(f"{proc.args} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill proc's group while proc is unreaped, so its id cannot belong to anyone else."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_digits_ddp_under_torchrun(tmp_path: Path) -> None:
    require("torch", "sklearn")
    env = clean_env()
    proc = start(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(DIGITS),
        ],
        env,
        tmp_path,
    )
    code, out, err = finish(proc, timeout=300)
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert re.search(r"^epoch 10 loss \d+\.\d{4}$", out, re.M), out
    accuracy = re.search(r"^accuracy: (\d\.\d+)$", out, re.M)
    assert accuracy and float(accuracy[1]) > 0.85, out
    assert re.search(r"^performance: \d+(\.\d+)? samples_per_second$", out, re.M), out
    assert "resumed" not in out
    assert list(tmp_path.iterdir()) == []  # no checkpoint without TREB_CHECKPOINT_DIR


def hello_env(rank: int, world: int, port: int, run_dir: Path) -> dict[str, str]:
    """The native launcher's contract for `world` ranks on one node."""
    return {
        **clean_env(),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "NODE_RANK": "0",
        "GROUP_RANK": "0",
        "NUM_NODES": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TREB_RUN_ID": "test-hello",
        "TREB_RUN_DIR": str(run_dir),
        "TREB_ATTEMPT": "0",
        "TREB_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }


def test_hello_three_native_ranks(tmp_path: Path) -> None:
    port = free_port()
    # Rank 0 last, so the others exercise their retry while nobody listens yet.
    procs = {
        rank: start([sys.executable, str(HELLO)], hello_env(rank, 3, port, tmp_path), tmp_path)
        for rank in (2, 1, 0)
    }
    try:
        results = {rank: finish(proc, timeout=90) for rank, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop(proc)
    for rank, (code, out, err) in results.items():
        assert code == 0, f"rank {rank}: stdout:\n{out}\nstderr:\n{err}"
        assert f"rank {rank} ok" in out
    assert "all 3 ranks said hello" in results[0][1]


def test_hello_reports_contract_failures(tmp_path: Path) -> None:
    env = hello_env(0, 1, free_port(), tmp_path)
    del env["TREB_RUN_ID"]
    env.update(GROUP_RANK="1", TREB_RUN_DIR=str(tmp_path / "missing"))
    code, out, err = finish(start([sys.executable, str(HELLO)], env, tmp_path), timeout=60)
    assert code == 3, err
    assert "CONTRACT FAIL: TREB_RUN_ID: not set" in err
    assert "CONTRACT FAIL: TREB_RUN_DIR:" in err
    assert "CONTRACT FAIL: GROUP_RANK:" in err


def test_hello_launcher_none_two_nodes(tmp_path: Path) -> None:
    port = free_port()
    procs = {}
    for node in (1, 0):
        env = hello_env(node, 2, port, tmp_path)
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
            del env[name]
        env.update(NODE_RANK=str(node), NUM_NODES="2", LOCAL_WORLD_SIZE="4")
        procs[node] = start([sys.executable, str(HELLO)], env, tmp_path)
    try:
        results = {node: finish(proc, timeout=90) for node, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop(proc)
    assert all(code == 0 for code, _, _ in results.values()), results
    assert "all 2 ranks said hello" in results[0][1]
