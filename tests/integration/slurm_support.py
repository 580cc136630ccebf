"""Fixtures for tests on the real test cluster (tests/slurm_cluster/cluster.sh): the default
partition `debug` over its 2 nodes tn1, tn2, and `big` over all 8 nodes.

Locally the Slurm tests skip when the cluster is not up; in CI (CI=true) that is a failure:
`make test` starts the cluster and must have it. Every job a test starts is cancelled by
job id when the test ends, finished or not.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, in_ci

CLUSTER = REPO / "tests" / "slurm_cluster" / "cluster.sh"


def _conf() -> str | None:
    if os.environ.get("SLURM_CONF"):
        return os.environ["SLURM_CONF"]
    try:
        out = subprocess.run(["bash", str(CLUSTER), "env"], capture_output=True, text=True,
                             timeout=10).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().removeprefix("export SLURM_CONF=") or None


@pytest.fixture(scope="session")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> str:
    """SLURM_CONF of a healthy test cluster whose nodes share this machine's /tmp."""
    conf = _conf()
    why = None
    if not conf or not Path(conf).is_file():
        why = "no test cluster config"
    else:
        env = {**os.environ, "SLURM_CONF": conf}
        res = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True, text=True,
                             env=env, timeout=60)  # fmt: skip
        if res.returncode != 0:
            why = f"test cluster not healthy: {res.stdout.strip()[-300:]}"
    if why:
        msg = f"{why} (start it: {CLUSTER} install && {CLUSTER} up)"
        if in_ci():
            pytest.fail(f"CI needs the Slurm test cluster: {msg}")
        pytest.skip(msg)
    # TREB_HOME lives under pytest's tmp dir: the nodes must see it (the filesystem is shared).
    probe = tmp_path_factory.mktemp("shared-fs-probe")
    subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", f'hostname > "{probe}/$(hostname)"'],
        env={**os.environ, "SLURM_CONF": conf}, check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    assert sorted(p.name for p in probe.iterdir()) == ["tn1", "tn2"], "filesystem not shared"
    return conf


@pytest.fixture
def streb(treb: TrebFn, treb_home: Path, slurm_conf: str, monkeypatch) -> Iterator[TrebFn]:
    """The `treb` runner against the test cluster; cancels the test's jobs afterwards."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    yield treb
    db = treb_home / "runs.db"
    if not db.exists():
        return
    from trebuchet.store.db import Store

    store = Store(db)
    ids = [r.backend_id for r in store.list() if r.backend == "slurm" and r.backend_id]
    store.close()
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def big_partition(slurm_conf: str) -> str:
    """The test cluster's partition over 8 nodes of >= 8 CPUs (`big`, from cluster.sh up)."""
    res = subprocess.run(["sinfo", "-h", "-p", "big", "-o", "%D %c"], capture_output=True,
                         text=True, env={**os.environ, "SLURM_CONF": slurm_conf}, timeout=60)  # fmt: skip
    got = res.stdout.split()
    if res.returncode != 0 or len(got) != 2 or int(got[0]) < 8 or int(got[1]) < 8:
        msg = f"no partition 'big' of 8 nodes x 8 CPUs (sinfo: {res.stdout.strip()!r}): "
        msg += f"start the cluster with {CLUSTER} up (TREB_SLURM_NODES=8, the default)"
        if in_ci():
            pytest.fail(f"CI needs the 8-node Slurm test cluster: {msg}")
        pytest.skip(msg)
    return "big"


def slurm(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


def slurm_state(job_id: str, timeout: float = 60) -> str:
    """Slurm's own final state of a job (squeue -t all, as sacct would say it), once it
    has left RUNNING and COMPLETING."""
    deadline = time.monotonic() + timeout
    while True:
        state = slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()
        if state not in ("RUNNING", "COMPLETING", "") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def release_requeued(job_id: str) -> None:
    """Start a requeued (PENDING) job now, not at the BeginTime Slurm gave it (~2 min). Not
    in the second of the requeue: slurmd revoked the job's credential then, refuses a launch
    whose credential is not newer (whole seconds), and slurmctld kills the job ("Killing
    non-startable batch JobId=56: Job credential revoked", a CI run): the delay that
    BeginTime keeps, cut to what the credential needs."""
    time.sleep(2)
    res = slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now")
    assert res.returncode == 0, res.stderr


def status(treb: TrebFn, run: str = "") -> dict:
    res = treb("status", *([run] if run else []), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def wait_for(treb: TrebFn, run: str, states: set[str], timeout: float = 300) -> dict:
    """Poll `treb status` until the run is in one of `states`."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(treb, run)
        if st["state"] in states:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run} still {st['state']} after {timeout}s: {st}")
        time.sleep(1)


def records(run_dir: str | Path, attempt: int = 0) -> dict[str, dict]:
    """The outcome records the job wrote for one attempt, by file stem (rank-3, node-1)."""
    adir = Path(run_dir) / f"attempt-{attempt}"
    return {p.stem: json.loads(p.read_text()) for p in adir.glob("*-[0-9]*.json")
            if not p.name.startswith("health-")}  # the nodes' checks: no process's  # fmt: skip


def wait_ranks_running(run_dir: str | Path, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len(records(run_dir)) < count:
        assert time.monotonic() < deadline, f"ranks did not start: {records(run_dir)}"
        time.sleep(0.3)
