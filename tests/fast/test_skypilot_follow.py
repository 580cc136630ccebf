"""`treb ps`/`status` follow SkyPilot runs after hand-over, in batched calls.

Why: ps/status must work the same whatever engine ran a run. No SkyPilot API server or cloud
can run here, so a stand-in `sky` module answers with the shapes and status names of
skypilot 0.14.1 (`sky.jobs.queue` records, `sky.job_status` dicts, the
ManagedJobStatus/JobStatus enum names); the names are checked against the real package
in `.venv-sky` when it is there.
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.conftest import in_ci
from trebuchet.backends.skypilot import state as sst
from trebuchet.backends.skypilot.engine import SkyPilotBackend
from trebuchet.store.db import RunRecord, Store

Managed = enum.Enum("ManagedJobStatus", "PENDING RUNNING RECOVERING SUCCEEDED FAILED_SETUP")
OnCluster = enum.Enum("JobStatus", "SETTING_UP RUNNING SUCCEEDED FAILED CANCELLED")


def add(store: Store, home: Path, rid: str, backend_id: str) -> None:
    store.insert_run(RunRecord(
        id=rid, name=rid, backend="skypilot", launcher="native", state="RUNNING", nodes=2,
        procs_per_node=1, run_dir=str(home / rid), created_at=time.time(), backend_id=backend_id,
    ))  # fmt: skip


def stand_in_sky(monkeypatch, queue: list, clusters: dict, calls: list) -> None:
    def job_status(cluster, job_ids):
        calls.append(("job_status", cluster, job_ids))
        if cluster not in clusters:
            raise RuntimeError(f"Cluster {cluster!r} does not exist.")
        return clusters[cluster]

    def jobs_queue(refresh, job_ids=None, skip_finished=False):
        calls.append(("jobs.queue", job_ids))
        return queue

    fake = types.SimpleNamespace(
        get=lambda request: request,  # the stand-in's "request ids" are the answers
        job_status=job_status,
        jobs=types.SimpleNamespace(queue=jobs_queue),
    )
    monkeypatch.setitem(sys.modules, "sky", fake)


def test_managed_and_cluster_jobs_in_one_call_each(treb_home, monkeypatch) -> None:
    store = Store()
    for rid, bid in [("m1", "jobs:1"), ("m2", "jobs:2"), ("m3", "jobs:3"), ("m4", "jobs:4"),
                     ("m5", "jobs:5"), ("c1", "cluster:treb-c1:1"),
                     ("c2", "cluster:treb-c2:1"), ("c3", "cluster:treb-c3:1")]:  # fmt: skip
        add(store, treb_home, rid, bid)
    queue = [
        {"job_id": 1, "status": Managed.RUNNING},
        {"job_id": 2, "status": Managed.RECOVERING},
        {"job_id": 3, "status": Managed.SUCCEEDED},
        {"job_id": 4, "status": Managed.FAILED_SETUP, "failure_reason": "pip install failed"},
    ]  # job 5: SkyPilot no longer knows it
    clusters = {"treb-c1": {1: OnCluster.FAILED}, "treb-c2": {1: OnCluster.SETTING_UP}}
    calls: list = []
    stand_in_sky(monkeypatch, queue, clusters, calls)
    SkyPilotBackend().refresh(store, store.list(active_only=True))
    assert [c for c in calls if c[0] == "jobs.queue"] == [("jobs.queue", [1, 2, 3, 4, 5])]
    assert len([c for c in calls if c[0] == "job_status"]) == 3  # one per cluster
    states = {r.id: r.state for r in store.list()}
    assert states == {"m1": "RUNNING", "m2": "RETRYING", "m3": "SUCCEEDED", "m4": "FAILED",
                      "m5": "LOST", "c1": "FAILED", "c2": "PENDING", "c3": "LOST"}  # fmt: skip
    assert store.attempts("m4")[0]["reason"] == "SkyPilot: FAILED_SETUP: pip install failed"
    assert "torn down after the job" in store.attempts("c3")[0]["reason"]


def test_without_skypilot_nothing_is_concluded(treb_home, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)
    store = Store()
    add(store, treb_home, "m", "jobs:9")
    SkyPilotBackend().refresh(store, store.list(active_only=True))
    assert store.get("m").state == "RUNNING"


def test_status_names_are_skypilots_own() -> None:
    """Every name the tables map exists in skypilot 0.14.1 (the real package, in .venv-sky)."""
    python = os.environ.get("TREB_SKYPILOT_PYTHON")
    if not python:
        if in_ci():
            pytest.fail("CI: set TREB_SKYPILOT_PYTHON (make test builds .venv-sky)")
        pytest.skip("no TREB_SKYPILOT_PYTHON")
    probe = ("from sky.jobs.state import ManagedJobStatus as M; "
             "from sky.skylet.job_lib import JobStatus as J; "
             "print(' '.join(s.name for s in M)); print(' '.join(s.name for s in J))")  # fmt: skip
    res = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    managed, cluster = (set(line.split()) for line in res.stdout.splitlines())
    assert set(sst.MANAGED_STATES) <= managed and set(sst.CLUSTER_STATES) <= cluster
    # every status either maps or is a failure (FAILED*), so none is shown RUNNING by default
    assert all(s in sst.MANAGED_STATES or s.startswith("FAILED") for s in managed)
    assert all(s in sst.CLUSTER_STATES or s.startswith("FAILED") for s in cluster)


def test_logs_come_from_skypilots_log_tail(treb_home, monkeypatch, capsys) -> None:
    """`treb logs` asks SkyPilot for the job's log (not followed: what is there now), into
    an output stream, and splits the node agents' labelled lines into per-rank logs."""
    from trebuchet.cli.main import main

    store = Store()
    add(store, treb_home, "m1", "jobs:4")
    add(store, treb_home, "c1", "cluster:treb-c1:2")
    store.update_run("c1", procs_per_node=2)
    store.update_run("m1", procs_per_node=2)
    calls: list = []
    text = "treb: node 1: starting\n[1:0] hello from rank 2\n[0:1] hi 1\n[1:1] bye 3\n"

    def tail(*args, follow, output_stream, **kw):
        calls.append((args, kw, follow))
        output_stream.write(text)
        return 0

    fake = types.SimpleNamespace(
        get=lambda request: request, tail_logs=tail,
        jobs=types.SimpleNamespace(tail_logs=tail, queue=lambda **kw: []),
        job_status=lambda cluster, ids: {i: None for i in ids},
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "sky", fake)
    assert main(["logs", "c1", "--rank", "3"]) == 0
    assert capsys.readouterr().out == "bye 3\n"
    assert calls[-1] == (("treb-c1", 2), {}, False)
    assert main(["logs", "m1", "--node", "1"]) == 0
    assert calls[-1] == ((), {"job_id": 4}, False)
    out = capsys.readouterr().out
    assert "[1:0] hello from rank 2\n" in out and "[1:1] bye 3\n" in out and "hi 1" not in out
    assert (treb_home / "m1" / "attempt-0" / "agent-node-0.log").read_text() == (
        "treb: node 1: starting\n"
    )


@pytest.mark.parametrize("backend_id", ["jobs:abc", "cluster:treb-c1:1x", "jobs:", "jobs:None"])
def test_cancel_of_a_damaged_job_id_is_a_named_error(treb_home, monkeypatch, backend_id) -> None:
    """A damaged index row (its SkyPilot job id not a number) gets treb's named error, not a
    ValueError traceback from int()."""
    from trebuchet.errors import UserError

    store = Store()
    add(store, treb_home, "d1", backend_id)
    stand_in_sky(monkeypatch, [], {}, [])
    with pytest.raises(UserError, match="no SkyPilot job id"):
        SkyPilotBackend().cancel(store, store.get("d1"))
