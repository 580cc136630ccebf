"""Diagnosis of srun job logs from the real 2-node test cluster (tests/slurm_cluster):
a task that raises ("srun: error: tn2: task 3: Exited with exit code 1"), gloo ranks on two
nodes that advertise their loopback address (GLOO_SOCKET_IFNAME=lo: the wrong-interface
failure), a job cancelled with scancel, and a step killed by its time limit.

Skipped when the cluster is not up; a failure in CI (CI=true), where `make test` starts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, needs

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
CLUSTER = REPO / "tests" / "slurm_cluster" / "cluster.sh"
PY = sys.executable


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    why = None
    try:
        line = subprocess.run(["bash", str(CLUSTER), "env"], capture_output=True, text=True,
                              timeout=20).stdout.strip()  # fmt: skip
        env = {**os.environ, "SLURM_CONF": line.removeprefix("export SLURM_CONF=")}
        ok = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True, env=env,
                            timeout=60).returncode == 0  # fmt: skip
        why = None if ok else "the Slurm test cluster is not up"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"the Slurm test cluster is not reachable: {exc}"
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{why} (CI needs it: {CLUSTER} up)")
        pytest.skip(f"{why} (start it: {CLUSTER} install && {CLUSTER} up)")
    return env


def diagnose(log: Path) -> dict:
    res = subprocess.run([PY, "-m", "trebuchet", "diagnose", str(log), "--json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def time_limited(
    slurm_env: dict[str, str], tmp_path_factory
) -> Iterator[tuple[Path, subprocess.Popen]]:
    """A 2-task step with a 1-minute limit, started first so the others run meanwhile."""
    log = tmp_path_factory.mktemp("timelimit") / "srun.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["srun", "-l", "-N2", "-n2", "--time=1", "-J", "treb-diag-timelimit", "bash", "-c",
             'echo "task $SLURM_PROCID up"; exec sleep 600'],
            stdout=out, stderr=subprocess.STDOUT, env=slurm_env,
        )  # fmt: skip
    yield log, proc
    if proc.poll() is None:
        subprocess.run(["scancel", "-n", "treb-diag-timelimit"], env=slurm_env, timeout=30)
        proc.wait(timeout=60)


def test_task_failure_in_a_batch_job(slurm_env, time_limited, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\n"
        f'srun {PY} -c \'\nimport os, time\nr = int(os.environ["SLURM_PROCID"])\n'
        'def check(shard):\n    raise ValueError(f"bad shard {shard}")\n'
        "if r == 3:\n    time.sleep(0.5); check(17)\ntime.sleep(5)\n'\n"
    )
    log = tmp_path / "slurm.out"
    res = subprocess.run(["sbatch", "--wait", "-o", str(log), str(script)], env=slurm_env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode != 0
    assert "srun: error: tn2: task 3: Exited with exit code 1" in log.read_text()
    root = diagnose(log)["root_cause"]
    assert (root["category"], root["rank"], root["node"]) == ("python_exception", 3, "tn2"), root
    assert "ValueError: bad shard 17" in root["summary"] and "in check" in root["summary"]


def test_gloo_on_the_loopback_interface_across_nodes(slurm_env, tmp_path: Path) -> None:
    needs("torch")
    (tmp_path / "ddp.py").write_text(
        "import os, datetime, torch, torch.distributed as dist\n"
        "os.environ['RANK'] = os.environ['SLURM_PROCID']\n"
        "os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=20))\n"
        "dist.all_reduce(torch.ones(1))\n"
    )
    log = tmp_path / "srun.log"
    with open(log, "w") as out:
        subprocess.run(
            ["srun", "-l", "--kill-on-bad-exit=1", "-N2", "-n2",
             "--export=ALL,GLOO_SOCKET_IFNAME=lo,MASTER_ADDR=tn1,MASTER_PORT=29731",
             PY, str(tmp_path / "ddp.py")],
            stdout=out, stderr=subprocess.STDOUT, env=slurm_env, timeout=300,
        )  # fmt: skip
    assert "remote=[127.0.0.1]" in log.read_text()
    root = diagnose(log)["root_cause"]
    assert root["category"] == "network_unreachable", root
    assert root["rank"] is None  # a wrong interface, not one rank's fault
    assert "GLOO_SOCKET_IFNAME" in root["remedy"]


def test_scancel_is_cancelled(slurm_env, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    # Cancelled once the step runs: a cancel between the batch script's start and its srun
    # may leave no "CANCELLED AT" line in the log (seen once in CI).
    script.write_text(
        "#!/bin/bash\n#SBATCH -N1 -n1\nsrun bash -c 'echo step-started; exec sleep 600'\n"
    )
    log = tmp_path / "slurm.out"
    job = subprocess.run(["sbatch", "--parsable", "-o", str(log), str(script)], env=slurm_env,
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    deadline = time.monotonic() + 60
    while "step-started" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    subprocess.run(["scancel", job], env=slurm_env, check=True)
    deadline = time.monotonic() + 60
    while "CANCELLED AT" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    root = diagnose(log)["root_cause"]
    assert root["category"] == "cancelled" and root["node"] in ("tn1", "tn2"), root


def test_time_limit(time_limited) -> None:
    log, proc = time_limited
    proc.wait(timeout=240)
    text = log.read_text()
    data = diagnose(log)
    assert {r["role"] for r in data["ranks"]} == {"stopped"}
    if "DUE TO TIME LIMIT" in text:
        assert data["root_cause"]["category"] == "time_limit"
    else:
        # Slurm lost slurmstepd's line (srun ended before it was forwarded: once in stop 44's
        # CI, never in 16 tries under load): the log says only that Slurm stopped the step.
        assert "srun: Job step aborted" in text
        assert data["root_cause"]["category"] == "stopped_by_slurm", data["root_cause"]


def test_a_failed_run_on_the_slurm_backend(slurm_env, treb, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "import os, time\ndef step(b):\n    raise ValueError(f'bad batch {b}')\n"
        "if os.environ['RANK'] == '2':\n    time.sleep(0.5)\n    step(17)\ntime.sleep(120)\n"
    )
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: [{PY}, job.py]\nnodes: 2\nprocs_per_node: 2\n")
    res = treb("run", str(spec), "--on", "slurm", env={"SLURM_CONF": slurm_env["SLURM_CONF"]},
               timeout=300)  # fmt: skip
    assert res.returncode == 1, res.stderr[-2000:]
    assert "  cause: python_exception on rank 2 (node tn2)" in res.stderr
    out = treb("diagnose", "--json", env={"SLURM_CONF": slurm_env["SLURM_CONF"]})
    root = json.loads(out.stdout)["root_cause"]
    assert (root["category"], root["rank"], root["node"]) == ("python_exception", 2, "tn2")


def test_sbatch_refusal_is_a_scheduler_refusal(slurm_env, treb, tmp_path: Path) -> None:
    # more memory per node than any node has: sbatch refuses the job outright
    spec = tmp_path / "job.yaml"
    spec.write_text("command: 'echo never'\nslurm:\n  mem: 900G\n")
    env = {"SLURM_CONF": slurm_env["SLURM_CONF"]}
    res = treb("run", str(spec), "--on", "slurm", env=env, timeout=300)
    assert res.returncode != 0
    assert "Requested node configuration is not available" in res.stderr
    root = json.loads(treb("diagnose", "--json", env=env).stdout)["root_cause"]
    assert root["category"] == "scheduler_refusal", root
    assert root["summary"] == (
        "sbatch refused the job: Requested node configuration is not available"
    )
    assert any("--mem=900G" in e for e in root["evidence"])
    # the fix lists what the partitions have, as sinfo says
    assert "debug (default): 2 nodes tn[1-2]" in root["remedy"], root["remedy"]
    assert "big: 8 nodes tn[1-8]" in root["remedy"]


def test_srun_refusal_in_a_job_log(slurm_env, tmp_path: Path) -> None:
    log = tmp_path / "srun.log"
    with open(log, "w") as out:
        subprocess.run(["srun", "-l", "--mem=900G", "true"], stdout=out,
                       stderr=subprocess.STDOUT, env=slurm_env, timeout=120)  # fmt: skip
    assert "Unable to allocate resources" in log.read_text()
    root = diagnose(log)["root_cause"]
    assert root["category"] == "scheduler_refusal", root
    assert any("Requested node configuration" in e for e in root["evidence"])


def test_job_that_left_the_queue_without_an_outcome(slurm_env, treb, tmp_path: Path) -> None:
    # A run whose Slurm job the controller no longer knows (as after its saved state was
    # wiped): a real held job is submitted, then the run is pointed at a job id this
    # controller never issued, and the real job is cancelled. squeue answers "Invalid job
    # id", accounting is off: the run ends LOST without an outcome record.
    from trebuchet.store.db import Store

    spec = tmp_path / "job.yaml"
    spec.write_text("command: 'echo never'\nslurm:\n  sbatch_args: [--hold]\n")
    env = {"SLURM_CONF": slurm_env["SLURM_CONF"]}
    rid = treb("run", str(spec), "--on", "slurm", "--detach", env=env).stdout.strip()
    real = json.loads(treb("status", rid, "--json", env=env).stdout)["backend_id"]
    try:
        Store().update_run(rid, backend_id="99999999")
    finally:
        subprocess.run(["scancel", real], env=slurm_env, timeout=60, check=True)
    st = json.loads(treb("status", rid, "--json", env=env).stdout)
    assert st["state"] == "LOST", st
    root = json.loads(treb("diagnose", rid, "--json", env=env).stdout)["root_cause"]
    assert root["category"] == "node_failure", root
    assert root["summary"].startswith("Slurm job 99999999 left the queue without an outcome")
    assert "supervisor" not in root["summary"]
    assert any("left the queue without an outcome record: is TREB_HOME" in e
               for e in root["evidence"])  # fmt: skip
    assert "`sacct -j 99999999`" in root["remedy"]
