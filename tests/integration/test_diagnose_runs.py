"""Diagnosis of real failing programs run by `treb run`: python and torch scripts that raise,
hang in a collective, kill themselves with SIGKILL (as the OOM killer would), crash with
SIGSEGV, import a missing module, miss the launcher's variables, find their port taken,
run past their time limit, are cancelled, or lose their launcher.

Each case checks `treb diagnose RUN --json` (the issue's shape and category names), and some
also the two lines at the end of `treb run` and in `treb status`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs, status_json, write_spec

pytestmark = pytest.mark.integration
PY = sys.executable


def diagnose(treb, run: str = "") -> dict:
    res = treb("diagnose", *([run] if run else []), "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) >= {"root_cause", "ranks"}
    return data


def role(data: dict, rank: int) -> str:
    return next(r["role"] for r in data["ranks"] if r["rank"] == rank)


def run(treb, tmp_path: Path, spec: str, script: str | None = None, *args: str):
    if script is not None:
        (tmp_path / "job.py").write_text(script)
    return treb("run", str(write_spec(tmp_path, spec)), *args, timeout=180)


def test_python_exception_names_rank_frame_and_cascade(treb, tmp_path: Path) -> None:
    script = (
        "import os, time\n"
        "def load_batch(i):\n"
        "    raise ValueError(f'corrupt sample in batch {i}')\n"
        "if os.environ['RANK'] == '2':\n"
        "    time.sleep(0.5)\n"
        "    load_batch(17)\n"
        "time.sleep(300)\n"
    )
    res = run(treb, tmp_path, f"command: [{PY}, job.py]\nnodes: 2\nprocs_per_node: 2\n", script)
    assert res.returncode == 1
    root = diagnose(treb)["root_cause"]
    assert (root["category"], root["rank"], root["node"]) == ("python_exception", 2, "1")
    assert "ValueError: corrupt sample in batch 17" in root["summary"]
    assert "job.py:3 in load_batch" in root["summary"]
    assert root["evidence"][-1].endswith("ValueError: corrupt sample in batch 17")
    data = diagnose(treb)
    assert [role(data, r) for r in (0, 1, 3)] == ["stopped"] * 3
    # the two lines at the end of the attached run, and in `treb status`
    assert "  cause: python_exception on rank 2 (node 1): ValueError" in res.stderr
    assert "  fix:" in res.stderr
    rid = status_json(treb)["id"]
    assert f"(`treb logs {rid} --rank 2` has its whole output)" in res.stderr  # filled in
    assert "cause: python_exception on rank 2" in treb("status").stdout
    st = status_json(treb)
    assert st["diagnosis"]["root_cause"]["rank"] == 2


def test_sigkill_without_launcher_kill_is_killed(treb, tmp_path: Path) -> None:
    # kill -9 of one rank, as the kernel OOM killer does
    spec = "command: 'if [ $RANK = 1 ]; then sleep 0.5; kill -9 $$; fi; exec sleep 300'\n"
    run(treb, tmp_path, spec + "procs_per_node: 3\n")
    data = diagnose(treb)
    root = data["root_cause"]
    assert (root["category"], root["rank"]) == ("killed", 1)
    assert "SIGKILL" in root["summary"] and "OOM" in root["summary"]
    assert role(data, 0) == role(data, 2) == "stopped"


def test_segfault(treb, tmp_path: Path) -> None:
    script = "import os, time, ctypes\nif os.environ['RANK'] == '0':\n    time.sleep(0.3)\n" \
             "    ctypes.string_at(0)\ntime.sleep(300)\n"  # fmt: skip
    run(treb, tmp_path, f"command: [{PY}, job.py]\nprocs_per_node: 2\n", script)
    root = diagnose(treb)["root_cause"]
    assert (root["category"], root["rank"]) == ("segfault", 0)
    assert "SIGSEGV" in root["summary"]
    # a run without GPUs: no CUDA/NCCL advice
    assert "without GPUs" in root["remedy"] and "CUDA" not in root["remedy"], root["remedy"]


def test_segfault_advice_on_a_run_with_gpus_names_cuda(treb, tmp_path: Path) -> None:
    # the same crash on a run that was given (detected, simulated) GPUs
    spec = f"command: [{PY}, -c, 'import ctypes; ctypes.string_at(0)']\ngpus_per_node: 1\n"
    res = treb("run", str(write_spec(tmp_path, spec)), timeout=180,
               env={"TREB_FAKE_GPUS": "nvidia:1"})  # fmt: skip
    assert res.returncode == 1, res.stderr
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "segfault"
    assert "CUDA" in root["remedy"] and "NCCL" in root["remedy"]


def test_missing_module(treb, tmp_path: Path) -> None:
    run(treb, tmp_path, f"command: [{PY}, job.py]\n", "import numpy\nimport flash_attn_nope\n")
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "missing_module" and root["rank"] == 0
    assert "No module named 'flash_attn_nope'" in root["summary"]


def test_command_not_found(treb, tmp_path: Path) -> None:
    run(treb, tmp_path, "command: [no-such-trainer-xyz, --lr, '0.1']\n")
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "bad_command" and "no-such-trainer-xyz" in root["summary"]


@pytest.mark.parametrize(
    "command,summary",
    [
        ("no-such-trainer-xyz --lr 0.1", "no-such-trainer-xyz: command not found"),  # bash, 127
        ("sh -c 'no-such-trainer-xyz'", "no-such-trainer-xyz"),  # dash's "not found", 127
        ("'echo )'", "syntax error near unexpected token"),  # bash exits 2
        ("./train.sh", "Permission denied"),  # not executable: 126
    ],
)
def test_a_command_that_cannot_start_is_bad_command(treb, tmp_path: Path, command: str,
                                                    summary: str) -> None:  # fmt: skip
    """Issue 25: exit 127 and bash syntax errors read `cause: unknown` (or a missing module)."""
    (tmp_path / "train.sh").write_text("echo hi\n")  # mode 644
    res = run(treb, tmp_path, f"command: {command}\n")
    assert res.returncode == 1, res.stderr
    assert "cause: bad_command" in res.stderr, res.stderr
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "bad_command" and summary in root["summary"], root
    assert "`treb render SPEC` shows the line bash gets" in root["remedy"]


def test_sigabrt_is_an_abort_not_a_segfault(treb, tmp_path: Path) -> None:
    res = run(treb, tmp_path, f"command: [{PY}, -c, 'import os; os.abort()']\n")
    assert res.returncode == 1
    assert "cause: aborted" in res.stderr, res.stderr
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "aborted" and "SIGABRT" in root["summary"], root
    assert "uncaught C++ exception" in root["remedy"]


def test_script_not_started_by_a_launcher(treb, tmp_path: Path) -> None:
    needs("torch")
    script = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"
    run(treb, tmp_path, f"launcher: none\ncommand: [{PY}, job.py]\n", script)
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "launch_env_missing", root
    assert "RANK expected, but not set" in root["summary"]


HANG_AT_INIT = (
    "import datetime, os, time\nimport torch.distributed as dist\n"
    "if os.environ['RANK'] == os.environ['HANG']:\n"
    "    print('loading a huge shard', flush=True)\n    time.sleep(300)\n"
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
)


def test_rank_that_never_joins_init_is_named(treb, tmp_path: Path) -> None:
    # Rank 1 of 2 never calls init_process_group: rank 0, which hosts the store, times out
    # waiting for it and is the launcher's first failure; the silent rank is the cause.
    needs("torch")
    spec = f"command: [{PY}, job.py]\nprocs_per_node: 2\nenv: {{HANG: '1'}}\n"
    res = run(treb, tmp_path, spec, HANG_AT_INIT)
    assert res.returncode == 1
    assert status_json(treb)["first_failure"]["rank"] == 0  # the launcher saw the victim
    data = diagnose(treb)
    root = data["root_cause"]
    assert (root["category"], root["rank"]) == ("collective_timeout", 1), root
    assert "rank 1 never joined" in root["summary"]
    assert any("loading a huge shard" in e for e in root["evidence"])
    assert role(data, 1) == "root_cause"
    assert "  cause: collective_timeout on rank 1" in res.stderr


def test_rank_0_that_never_hosts_the_rendezvous_is_named(treb, tmp_path: Path) -> None:
    # Rank 0 of 4 never starts the store: the others' "client socket has timed out while
    # trying to connect" names the rendezvous host.
    needs("torch")
    spec = f"command: [{PY}, job.py]\nprocs_per_node: 4\nenv: {{HANG: '0'}}\n"
    run(treb, tmp_path, spec, HANG_AT_INIT)
    root = diagnose(treb)["root_cause"]
    assert (root["category"], root["rank"]) == ("collective_timeout", 0), root
    assert "rank 0 never joined" in root["summary"]


def test_rank_that_hangs_before_a_collective_is_named(treb, tmp_path: Path) -> None:
    needs("torch")
    script = (
        "import datetime, os, time, torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
        "if dist.get_rank() == 1:\n    print('rank 1 stuck in data loading', flush=True)\n"
        "    time.sleep(300)\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    run(treb, tmp_path, f"command: [{PY}, job.py]\nprocs_per_node: 2\n", script)
    root = diagnose(treb)["root_cause"]
    assert (root["category"], root["rank"]) == ("collective_timeout", 1), root
    assert "Timed out waiting" in root["summary"]


def test_port_already_taken_by_another_program(treb, tmp_path: Path) -> None:
    needs("torch")
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        script = "import datetime, torch.distributed as dist\n" \
                 "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=5))\n"  # fmt: skip
        spec = f"command: [{PY}, job.py]\nprocs_per_node: 2\nmaster_port: {port}\n"
        run(treb, tmp_path, spec, script)
    finally:
        holder.close()
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "port_in_use" and root["rank"] is None, root
    assert "EADDRINUSE" in " ".join(root["evidence"])


def test_time_limit(treb, tmp_path: Path) -> None:
    # a program silent after its first line: the limit is reached, and it was likely hung
    spec = "command: 'echo working; exec sleep 300'\ntimeout: 3s\nprocs_per_node: 2\n"
    res = run(treb, tmp_path, spec)
    assert res.returncode == 1
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "time_limit" and root["rank"] is None
    assert "time limit" in root["summary"]
    assert "  cause: time_limit" in res.stderr
    assert "no rank had written anything for the last" in root["summary"], root
    assert "likely hung" in root["summary"] and "likely hung" in res.stderr
    assert any(e.startswith("last output: rank") and e.endswith(": working")
               for e in root["evidence"]), root  # fmt: skip
    assert "more time would not help" in root["remedy"]


def test_time_limit_of_a_program_that_keeps_printing_is_not_hung(treb, tmp_path: Path) -> None:
    script = "import time\nwhile True:\n    print('step', flush=True)\n    time.sleep(0.05)\n"
    res = run(treb, tmp_path, f"command: [{PY}, job.py]\ntimeout: 3s\n", script)
    assert res.returncode == 1
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "time_limit"
    assert "hung" not in root["summary"], root
    assert "raise timeout:" in root["remedy"]


def test_cancelled(treb, treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo up; exec sleep 300'\nprocs_per_node: 2\n")
    rid = treb("run", str(spec), "--detach").stdout.strip()
    deadline = time.monotonic() + 60
    while not list((treb_home / "runs" / rid).glob("attempt-0/rank-*.log")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert treb("cancel", rid).returncode == 0
    data = diagnose(treb, rid)
    assert data["root_cause"]["category"] == "cancelled"
    assert all(r["role"] == "stopped" for r in data["ranks"])


def test_launcher_killed_is_a_lost_supervisor(treb, treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo up; exec sleep 300'\n")
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 60
    while not [p for p in (treb_home / "runs").glob("*/attempt-0/rank-0.log") if p.read_text()]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while status_json(treb)["state"] != "LOST":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "node_failure" and "supervisor" in root["summary"]


def test_environment_build_with_a_package_not_in_the_registry(treb, tmp_path: Path) -> None:
    spec = "command: 'echo never'\nenvironment:\n  requirements: [treb-no-such-package-xyz]\n"
    res = run(treb, tmp_path, spec)
    assert res.returncode == 1
    root = diagnose(treb)["root_cause"]
    assert root["category"] == "environment_build", root
    assert "treb-no-such-package-xyz was not found in the package index" in root["summary"]
    assert any("pip install" in e for e in root["evidence"]), root  # uv pip, or pip without uv
    assert "  cause: environment_build: the environment build failed" in res.stderr
    assert "environment.requirements" in root["remedy"]


def test_unknown_failure_keeps_rank_and_last_error_lines(treb, tmp_path: Path) -> None:
    spec = ("command: 'if [ $RANK = 1 ]; then echo \"checksum mismatch in shard 9\" >&2; "
            "echo \"giving up\" >&2; exit 3; fi; exec sleep 300'\nprocs_per_node: 2\n")  # fmt: skip
    run(treb, tmp_path, spec)
    root = diagnose(treb)["root_cause"]
    assert (root["category"], root["rank"]) == ("unknown", 1)
    assert "exit code 3" in root["summary"]
    assert any("checksum mismatch" in e for e in root["evidence"])
    rid = status_json(treb)["id"]
    assert f"(`treb logs {rid} --rank 1` has its whole output)" in root["remedy"]


def test_torchrun_launcher_run(treb, tmp_path: Path) -> None:
    needs("torch")
    script = (
        "import os, time\n"
        "def shard(i):\n    raise KeyError(f'missing column label in shard {i}')\n"
        "if os.environ['RANK'] == '3':\n    time.sleep(0.5)\n    shard(7)\n"
        "time.sleep(300)\n"
    )
    spec = f"launcher: torchrun\ncommand: [{PY}, job.py]\nnodes: 2\nprocs_per_node: 2\n"
    run(treb, tmp_path, spec, script)
    data = diagnose(treb)
    root = data["root_cause"]
    assert (root["category"], root["rank"], root["node"]) == ("python_exception", 3, "1"), root
    assert "job.py:3 in shard" in root["summary"]
    assert role(data, 0) == "stopped"


def test_a_copied_run_directory_is_diagnosed_without_the_store(treb, tmp_path: Path) -> None:
    script = "import os, time\nif os.environ['RANK'] == '1':\n    time.sleep(0.3)\n" \
             "    raise RuntimeError('loss is NaN at step 12')\ntime.sleep(300)\n"  # fmt: skip
    run(treb, tmp_path, f"command: [{PY}, job.py]\nprocs_per_node: 2\n", script)
    run_dir = status_json(treb)["run_dir"]
    res = treb("diagnose", run_dir, "--json", env={"TREB_HOME": str(tmp_path / "elsewhere")})
    root = json.loads(res.stdout)["root_cause"]
    assert (root["category"], root["rank"]) == ("python_exception", 1)
    assert "loss is NaN" in root["summary"]
