"""Experiment trackers against a real `mlflow server` (sqlite backend, proxied artifacts)
started by this module: trebuchet's REST client creates and ends the runs, the ranks'
own `mlflow` client continues them, and a tracker that does not answer changes nothing.

Why real: MLflow's API has limits and shapes (log-batch sizes, artifact proxying, the
MLFLOW_RUN_ID handshake of `mlflow.start_run()`) that only a server checks. The server
runs from .venv-mlflow (`make test` builds it; TREB_MLFLOW_PYTHON names its python), one
per module, stopped by its process group. It binds the Slurm test cluster's bridge
address when there is one (the nodes are network namespaces that cannot reach this
host's 127.0.0.1), else 127.0.0.1; both are private to this machine.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, in_ci, status_json, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    release_requeued,
    slurm_conf,
    streb,
)
from tests.slow_http import SlowProxy, wait_until

pytestmark = pytest.mark.integration
BRIDGE = "10.77.0.1"  # tests/slurm_cluster/cluster.sh's bridge (trebbr0)


def _mlflow_python() -> str:
    py = os.environ.get("TREB_MLFLOW_PYTHON") or str(REPO / ".venv-mlflow" / "bin" / "python")
    if not Path(py).exists():
        msg = f"no mlflow venv at {py} (make test builds .venv-mlflow)"
        if in_ci():
            pytest.fail(msg)
        pytest.skip(msg)
    return py


def _host() -> str:
    with socket.socket() as s:
        try:
            s.bind((BRIDGE, 0))
        except OSError:
            return "127.0.0.1"
    return BRIDGE


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    py = _mlflow_python()
    root = tmp_path_factory.mktemp("mlflow")
    host = _host()
    port = _free_port(host)
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [py, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
         "--host", host, "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )  # fmt: skip
    uri = f"http://{host}:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()}")
            time.sleep(0.5)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
        log.close()


# -- reading the server (plain REST, not trebuchet's client) ------------------------------------
def api(uri: str, endpoint: str, body: dict | None = None, **query: str) -> dict:
    url = f"{uri}/api/2.0/mlflow/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def ml_run(uri: str, run_id: str) -> dict:
    """{status, params, tags, metrics, artifacts} of one MLflow run."""
    run = api(uri, "runs/get", run_id=run_id)["run"]
    data = run["data"]
    arts = api(uri, "artifacts/list", run_id=run_id).get("files", [])
    return {
        "status": run["info"]["status"],
        "experiment_id": run["info"]["experiment_id"],
        "params": {p["key"]: p["value"] for p in data.get("params", [])},
        "tags": {t["key"]: t["value"] for t in data.get("tags", [])},
        "metrics": {m["key"]: m["value"] for m in data.get("metrics", [])},
        "artifacts": {a["path"] for a in arts},
    }


def artifact(uri: str, run: dict, name: str) -> str:
    exp, rid = run["experiment_id"], run["tags"]["treb.mlflow_run"]
    url = f"{uri}/api/2.0/mlflow-artifacts/artifacts/{exp}/{rid}/artifacts/{name}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def tracking_of(run_dir: str) -> dict:
    return json.loads((Path(run_dir) / "tracking.json").read_text())


def events(run_dir: str) -> list[dict]:
    lines = (Path(run_dir) / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def tracked(uri: str, run_dir: str) -> dict:
    rid = tracking_of(run_dir)["mlflow"]["run_id"]
    out = ml_run(uri, rid)
    out["tags"]["treb.mlflow_run"] = rid
    return out


def wait_status(uri: str, run_dir: str, timeout: float = 120) -> dict:
    """The MLflow run once it has a final status (read from the server only)."""
    deadline = time.monotonic() + timeout
    while True:
        run = tracked(uri, run_dir)
        if run["status"] != "RUNNING":
            return run
        assert time.monotonic() < deadline, f"MLflow run still RUNNING: {run}"
        time.sleep(0.5)


# -- local runs -------------------------------------------------------------------------------
def test_detached_run_logs_params_tags_spec_and_finished(treb, tmp_path, mlflow_server) -> None:
    spec = write_spec(tmp_path / "w", f"""
name: tracked
command: |
  echo "run $MLFLOW_RUN_ID exp $MLFLOW_EXPERIMENT_ID at $MLFLOW_TRACKING_URI"
  echo '{{"step": 1, "loss": 2.5}}'; echo '{{"step": 2, "loss": 1.5, "acc": 0.75}}'
  seq 1500 | sed 's/.*/{{"step": &, "x": &}}/'
procs_per_node: 2
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-tests}}
""")  # fmt: skip
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    run = wait_status(mlflow_server, st["run_dir"])
    info = tracking_of(st["run_dir"])["mlflow"]
    assert run["status"] == "FINISHED"
    assert run["params"]["treb.launcher"] == "native"
    assert run["params"]["treb.backend"] == "local"
    assert (run["params"]["treb.nodes"], run["params"]["treb.procs_per_node"]) == ("1", "2")
    assert run["tags"]["treb.run_id"] == st["id"]
    assert run["tags"]["treb.shape"] == "1x2"
    assert run["tags"]["mlflow.runName"] == "tracked"
    assert "spec.yaml" in run["artifacts"]
    assert "name: tracked" in artifact(mlflow_server, run, "spec.yaml")
    exp = api(mlflow_server, "experiments/get-by-name", experiment_name="treb-tests")
    assert exp["experiment"]["experiment_id"] == run["experiment_id"]
    # every rank got the ids of this run
    for rank in (0, 1):
        log = (Path(st["run_dir"]) / "attempt-0" / f"rank-{rank}.log").read_text()
        assert f"run {info['run_id']} exp {run['experiment_id']} at {mlflow_server}" in log
    wait = time.monotonic() + 30  # the supervisor tags the state with the status
    while run["tags"].get("treb.state") != "SUCCEEDED" and time.monotonic() < wait:
        time.sleep(0.2)
        run = tracked(mlflow_server, st["run_dir"])
    assert run["tags"]["treb.state"] == "SUCCEEDED"
    # the metrics read from rank 0's log (store/metrics.py), the same values in MLflow
    rid = info["run_id"]
    wait = time.monotonic() + 30  # sent after the status and the tags (tracking.close)
    while "metrics" not in (hist := api(mlflow_server, "metrics/get-history", run_id=rid,
                                        metric_key="loss")) and time.monotonic() < wait:  # fmt: skip
        time.sleep(0.2)
    assert sorted((m["step"], m["value"]) for m in hist["metrics"]) == [(1, 2.5), (2, 1.5)]
    run = tracked(mlflow_server, st["run_dir"])
    assert run["metrics"]["acc"] == 0.75
    wait = time.monotonic() + 30  # more than one log-batch call (1000 at most): the second
    while len(hist := api(mlflow_server, "metrics/get-history", run_id=rid, metric_key="x")
              ["metrics"]) < 1500 and time.monotonic() < wait:  # may come after loss's  # fmt: skip
        time.sleep(0.2)
    assert len(hist) == 1500
    got = json.loads(treb("metrics", st["id"], "--json").stdout)
    assert got, "treb metrics shows them too"


def test_failed_run_is_failed_with_its_diagnosis(treb, tmp_path, mlflow_server) -> None:
    """MLFLOW_TRACKING_URI from the shell is enough; the experiment is the run's name."""
    spec = write_spec(tmp_path / "w", """
name: tracked-fail
command: 'if [ "$RANK" = 1 ]; then echo "ValueError: bad batch" >&2; exit 3; fi; sleep 30'
procs_per_node: 2
""")  # fmt: skip
    res = treb("run", str(spec), env={"MLFLOW_TRACKING_URI": mlflow_server})
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    run = tracked(mlflow_server, st["run_dir"])  # attached: final before `treb run` returns
    assert run["status"] == "FAILED"
    assert run["tags"]["treb.state"] == "FAILED"
    assert run["tags"]["treb.exit_code"] == "3"
    assert {"diagnosis.txt", "diagnosis.json"} <= run["artifacts"]
    text = artifact(mlflow_server, run, "diagnosis.txt")
    assert "rank 1" in text and "ValueError: bad batch" in text
    exp = api(mlflow_server, "experiments/get-by-name", experiment_name="tracked-fail")
    assert exp["experiment"]["experiment_id"] == run["experiment_id"]


RANK_SCRIPT = """
import os, sys
import mlflow
attempt = int(os.environ["TREB_ATTEMPT"])
with mlflow.start_run() as run:  # MLFLOW_RUN_ID: trebuchet's run, continued
    mlflow.log_metric("loss", 1.0 / (attempt + 1), step=attempt)
    mlflow.log_param(f"attempt{attempt}_run", run.info.run_id)
sys.exit(1 if attempt == 0 else 0)
"""


def test_rank_client_and_retries_log_into_one_run(treb, tmp_path, mlflow_server) -> None:
    """The rank's own `mlflow` (the real client) continues trebuchet's run; a retried
    attempt continues the same one, and the run ends FINISHED."""
    py = _mlflow_python()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "train.py").write_text(RANK_SCRIPT)
    spec = write_spec(tmp_path / "w", f"""
name: tracked-retry
command: ["{py}", "train.py"]
retries: 1
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-retry}}
""")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    assert st["attempt"] == 1
    run = tracked(mlflow_server, st["run_dir"])
    rid = run["tags"]["treb.mlflow_run"]
    assert run["status"] == "FINISHED"
    assert run["params"]["attempt0_run"] == rid == run["params"]["attempt1_run"]
    hist = api(mlflow_server, "metrics/get-history", run_id=rid, metric_key="loss")["metrics"]
    assert sorted((m["step"], m["value"]) for m in hist) == [(0, 1.0), (1, 0.5)]
    assert run["tags"]["treb.attempts"] == "2"
    found = api(mlflow_server, "runs/search", {"experiment_ids": [run["experiment_id"]]})
    assert [r["info"]["run_id"] for r in found["runs"]] == [rid]  # one run, not one per attempt


def test_sweep_is_a_parent_with_children(treb, tmp_path, mlflow_server) -> None:
    spec = write_spec(tmp_path / "w", f"""
name: tracked-sweep
command: 'test "$LR" != 0.2'
sweep: {{env.LR: [0.1, 0.2]}}
sweep_parallel: 2
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-sweep}}
""")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr  # one point fails
    exp = api(mlflow_server, "experiments/get-by-name", experiment_name="treb-sweep")
    found = api(mlflow_server, "runs/search",
                {"experiment_ids": [exp["experiment"]["experiment_id"]]})["runs"]  # fmt: skip
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"]["tags"]} for r in found}
    parents = [rid for rid, t in tags.items() if "mlflow.parentRunId" not in t]
    assert len(parents) == 1 and len(found) == 3
    children = [ml_run(mlflow_server, rid) for rid in tags if rid != parents[0]]
    assert {c["tags"]["mlflow.parentRunId"] for c in children} == {parents[0]}
    by_lr = {c["params"]["env.LR"]: c["status"] for c in children}
    assert by_lr == {"0.1": "FINISHED", "0.2": "FAILED"}
    sweep_id = children[0]["tags"]["treb.sweep_id"]
    assert tags[parents[0]]["treb.sweep_id"] == sweep_id
    deadline = time.monotonic() + 30  # the last point's supervisor ends the parent
    while (parent := ml_run(mlflow_server, parents[0]))["status"] == "RUNNING":
        assert time.monotonic() < deadline, parent
        time.sleep(0.2)
    assert parent["status"] == "FAILED"
    assert parent["tags"]["treb.failed_points"] == "1"


# -- Slurm ------------------------------------------------------------------------------------
@pytest.mark.slurm
def test_slurm_run_ends_finished_by_the_controller(streb, tmp_path, mlflow_server) -> None:
    """Detached and never followed: the job controller itself sets FINISHED."""
    if not mlflow_server.startswith(f"http://{BRIDGE}:"):
        pytest.fail("the mlflow server is not on the cluster's bridge")
    spec = write_spec(tmp_path / "w", f"""
name: tracked-slurm
command: echo "rank $RANK run $MLFLOW_RUN_ID"
procs_per_node: 2
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-slurm}}
""")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = next((Path(os.environ["TREB_HOME"]) / "runs").iterdir())
    run = wait_status(mlflow_server, str(run_dir), timeout=180)  # no `treb` call meanwhile
    assert run["status"] == "FINISHED"
    assert run["tags"]["treb.state"] == "SUCCEEDED"
    assert run["params"]["treb.backend"] == "slurm"
    rid = run["tags"]["treb.mlflow_run"]
    for rank in (0, 1):
        assert f"rank {rank} run {rid}" in (run_dir / "attempt-0" / f"rank-{rank}.log").read_text()
    st = status_json(streb)  # the submitting side then adds what only it has
    assert st["state"] == "SUCCEEDED"
    assert (run_dir / "tracking-closed").exists()
    assert tracked(mlflow_server, str(run_dir))["tags"]["treb.attempts"] == "1"


@pytest.mark.slurm
def test_slurm_requeue_keeps_one_mlflow_run(streb, tmp_path, mlflow_server) -> None:
    """`scontrol requeue` of a running job (as a preemption): the controller marks the
    MLflow run KILLED at the SIGTERM, RUNNING again when the job restarts, and the next
    attempt's ranks log into the same run, which ends FINISHED."""
    spec = write_spec(tmp_path / "w", f"""
name: tracked-requeue
command: |
  echo "attempt $TREB_ATTEMPT run $MLFLOW_RUN_ID"
  if [ "$TREB_ATTEMPT" = 0 ]; then sleep 300; fi
retries: 1
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-requeue}}
""")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    run_dir = next((Path(os.environ["TREB_HOME"]) / "runs").iterdir())
    rid = tracking_of(str(run_dir))["mlflow"]["run_id"]
    job = json.loads((run_dir / "events.jsonl").read_text().splitlines()[-1])["job_id"]
    log0 = run_dir / "attempt-0" / "rank-0.log"
    deadline = time.monotonic() + 120
    while not (log0.exists() and f"attempt 0 run {rid}" in log0.read_text()):
        assert time.monotonic() < deadline, "attempt 0 did not start"
        time.sleep(0.5)
    run_sh = ["scontrol", "requeue", job]
    assert subprocess.run(run_sh, capture_output=True, timeout=60).returncode == 0
    deadline = time.monotonic() + 120
    while True:  # Slurm holds a requeued job (BeginTime): release it once it is PENDING
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                             text=True, timeout=60).stdout.strip()  # fmt: skip
        if out == "PENDING":
            release_requeued(job)
            break
        assert time.monotonic() < deadline, f"job {job} not requeued: {out!r}"
        time.sleep(0.5)
    deadline = time.monotonic() + 180
    while True:  # the tags, then the status: two requests (runtime/tracking.mark)
        run = tracked(mlflow_server, str(run_dir))
        if run["tags"].get("treb.state") == "SUCCEEDED" and run["status"] == "FINISHED":
            break
        assert time.monotonic() < deadline, run
        time.sleep(0.5)
    assert f"attempt 1 run {rid}" in (run_dir / "attempt-1" / "rank-0.log").read_text()
    marks = [e["state"] for e in events(str(run_dir)) if e["event"] == "mlflow_status"]
    assert marks[-2:] == ["RUNNING", "SUCCEEDED"], marks  # KILLED at the SIGTERM before
    found = api(mlflow_server, "runs/search", {"experiment_ids": [run["experiment_id"]]})
    assert [r["info"]["run_id"] for r in found["runs"]] == [rid]


# -- a slow server: the run's own life never waits on it ----------------------------------------
@pytest.fixture
def proxy(mlflow_server: str) -> Iterator[SlowProxy]:
    """tests/slow_http.py's proxy in front of the real server: slow or trickling on demand."""
    p = SlowProxy(mlflow_server)
    try:
        yield p
    finally:
        p.close()


def pending_of(run_dir: str) -> dict | None:
    path = Path(run_dir) / "tracking-pending.json"
    return json.loads(path.read_text()) if path.exists() else None


def retry_until_sent(treb, run_dir: str, timeout: float = 90) -> None:
    """`treb ps` (what any `treb` that refreshes runs does) until nothing is pending."""
    deadline = time.monotonic() + timeout
    while (left := pending_of(run_dir)) is not None:
        assert time.monotonic() < deadline, left
        time.sleep(max(0.0, min(2.0, float(left.get("next_try") or 0) - time.time())))
        assert treb("ps").returncode == 0
    assert not (Path(os.environ["TREB_HOME"]) / "tracking-pending").exists()


def test_an_end_that_did_not_get_through_is_sent_by_the_next_treb(
    treb, tmp_path, mlflow_server, proxy
) -> None:
    """The server stops answering (it trickles) as the run ends: the supervisor gives up
    within its budget, keeps the end in the pending file, and the next `treb ps` after the
    server is back sends it: the MLflow run does not stay RUNNING."""
    work = tmp_path / "w"
    spec = write_spec(work, f"""
name: tracked-late
command: |
  echo '{{"step": 1, "loss": 0.5}}'; touch {work}/started
  while [ ! -e {work}/go ]; do sleep 0.1; done
tracking:
  mlflow: {{uri: "{proxy.uri}", experiment: treb-late}}
""")  # fmt: skip
    assert treb("run", str(spec), "--detach").returncode == 0
    run_dir = next((Path(os.environ["TREB_HOME"]) / "runs").iterdir())
    wait_until(lambda: (work / "started").exists(), 60, "the run to start")
    proxy.mode, proxy.trickle_s = "trickle", 0.5
    (work / "go").touch()
    wait_until(lambda: any(e["event"] == "tracking_failed" for e in events(str(run_dir))), 60,
               "the supervisor's end to fail")  # fmt: skip
    assert tracked(mlflow_server, str(run_dir))["status"] == "RUNNING"
    kept = pending_of(str(run_dir))
    assert kept is not None and kept["status"]["state"] == "SUCCEEDED"
    assert "did not answer within 3 s" in kept["error"]
    # still trickling: `treb ps` tries (after the pause) within its own budget, no longer
    time.sleep(max(0.0, kept["next_try"] - time.time()))
    t0 = time.monotonic()
    assert treb("ps").returncode == 0
    assert time.monotonic() - t0 < 9
    assert tracked(mlflow_server, str(run_dir))["status"] == "RUNNING"
    proxy.mode = "pass"
    asked = len(proxy.requests)
    retry_until_sent(treb, str(run_dir))
    assert proxy.paths()[asked].endswith("runs/update")  # the status first
    run = tracked(mlflow_server, str(run_dir))
    assert run["status"] == "FINISHED" and run["tags"]["treb.state"] == "SUCCEEDED"
    assert run["metrics"]["loss"] == 0.5 and run["tags"]["treb.attempts"] == "1"
    assert "spec.yaml" in run["artifacts"] and run["params"]["treb.backend"] == "local"


def test_a_slow_server_costs_a_run_bounded_time(treb, tmp_path, mlflow_server, proxy) -> None:
    """A server that answers every request in 2 s: `treb run` of a 3 s run pays at most the
    submission's 5 s and the end's 3 s (it took a minute), `treb ps` at most its 3 s; what
    did not get through arrives later, all of it."""
    api(mlflow_server, "experiments/create", {"name": "treb-slow"})  # 2 requests, not 3
    proxy.mode, proxy.delay_s = "delay", 2.0
    spec = write_spec(tmp_path / "w", f"""
name: tracked-slow
command: |
  seq 2500 | sed 's/.*/{{"step": &, "x": &}}/'
  sleep 3; echo "ValueError: bad batch" >&2; exit 3
tracking:
  mlflow: {{uri: "{proxy.uri}", experiment: treb-slow}}
""")  # fmt: skip
    t0 = time.monotonic()
    res = treb("run", str(spec))
    took = time.monotonic() - t0
    assert took < 3 + 5 + 3 + 6, took  # the run, submission, end; starting Python twice
    assert res.returncode == 1, res.stderr
    assert "warning: mlflow:" in res.stderr
    st = status_json(treb)
    assert st["state"] == "FAILED"
    t0 = time.monotonic()
    assert treb("ps").returncode == 0
    assert time.monotonic() - t0 < 9
    proxy.mode = "pass"
    retry_until_sent(treb, st["run_dir"])
    run = tracked(mlflow_server, st["run_dir"])
    assert run["status"] == "FAILED" and run["tags"]["treb.state"] == "FAILED"
    assert run["tags"]["treb.exit_code"] == "3" and "ValueError" in run["tags"]["treb.cause"]
    assert {"spec.yaml", "diagnosis.txt", "diagnosis.json"} <= run["artifacts"]
    assert run["params"]["treb.launcher"] == "native"
    rid = run["tags"]["treb.mlflow_run"]
    hist = api(mlflow_server, "metrics/get-history", run_id=rid, metric_key="x")["metrics"]
    assert sorted(m["step"] for m in hist) == list(range(1, 2501))  # each point once


def test_a_trickling_server_at_submission(treb, tmp_path, proxy) -> None:
    """A server that trickles its answer: `treb run` starts the run after the submission's
    5 s (it waited as long as the server trickled), and Ctrl+C is not held up: the run,
    recorded but not started, is CANCELLED."""
    proxy.mode, proxy.trickle_s = "trickle", 1.0
    spec = write_spec(tmp_path / "w", f"""
name: trickled
command: echo ok
tracking:
  mlflow: {{uri: "{proxy.uri}"}}
""")  # fmt: skip
    t0 = time.monotonic()
    res = treb("run", str(spec), timeout=60)
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 < 5 + 5, "the submission's budget, and starting Python"
    assert "did not answer within 5 s" in res.stderr and "the run goes on" in res.stderr
    assert status_json(treb)["state"] == "SUCCEEDED"
    asked = proxy.connections
    # Ctrl+C from a terminal: SIGINT at its default (a CI job started in the background
    # hands its children SIGINT ignored, and Python then raises no KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:

        def asking() -> bool:  # the new run is recorded and its submission asks the server
            runs = json.loads(treb("ps", "--all", "--json").stdout)
            return proxy.connections > asked and any(r["state"] == "PENDING" for r in runs)

        wait_until(asking, 30, "the submission to ask the server")
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        # a hang guard only (no timing assertion: CI machines are shared): a Ctrl+C that was
        # held up would let the run start after the budget and end SUCCEEDED with exit 0
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    runs = json.loads(treb("ps", "--all", "--json").stdout)
    assert sorted(r["state"] for r in runs) == ["CANCELLED", "SUCCEEDED"]


def test_secret_values_never_reach_mlflow(treb, tmp_path, mlflow_server) -> None:
    """A secret (its value from the environment) used in env values, and printed by the
    failing rank (so the diagnosis quotes it): no param, tag or artifact of the MLflow run
    holds its value; the diagnosis names it instead."""
    secret = "tr4ck-s3cret-never-sent"
    spec = write_spec(tmp_path / "w", f"""
name: tracked-secret
command: 'echo "RuntimeError: the hub refused token $HF_TOKEN" >&2; exit 3'
secrets: [TRACK_SECRET]
env: {{HF_TOKEN: "${{TRACK_SECRET}}", SUFFIXED: "x-${{TRACK_SECRET}}-y"}}
tracking:
  mlflow: {{uri: "{mlflow_server}", experiment: treb-secret}}
""")  # fmt: skip
    res = treb("run", str(spec), "-o", "env.MODE=fast", env={"TRACK_SECRET": secret})
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    run = tracked(mlflow_server, st["run_dir"])
    assert run["status"] == "FAILED" and run["params"]["treb.backend"] == "local"
    for kind in ("params", "tags"):
        for key, value in run[kind].items():
            assert secret not in value, (kind, key)
    assert {"spec.yaml", "diagnosis.txt", "diagnosis.json"} <= run["artifacts"]
    for name in run["artifacts"]:
        assert secret not in artifact(mlflow_server, run, name), name
    assert "TRACK_SECRET" in artifact(mlflow_server, run, "spec.yaml")
    assert "refused token ${TRACK_SECRET}" in artifact(mlflow_server, run, "diagnosis.txt")
    assert "${TRACK_SECRET}" in run["tags"]["treb.cause"]


# -- no server ------------------------------------------------------------------------------
def test_unreachable_server_does_not_fail_the_run(treb, tmp_path) -> None:
    port = _free_port("127.0.0.1")  # nothing listens there
    spec = write_spec(tmp_path / "w", f"""
name: untracked
command: echo "ok $MLFLOW_RUN_ID."
tracking:
  mlflow: {{uri: "http://127.0.0.1:{port}"}}
""")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    assert "warning: mlflow:" in res.stderr and "the run goes on" in res.stderr
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    assert "ok ." in (Path(st["run_dir"]) / "attempt-0" / "rank-0.log").read_text()
    failed = [e for e in events(st["run_dir"]) if e["event"] == "tracking_failed"]
    assert failed and "did not answer" in failed[0]["error"]


def test_wandb_variables_reach_every_rank_and_attempt(treb, tmp_path) -> None:
    spec = write_spec(tmp_path / "w", """
name: wb
command: 'env | grep ^WANDB_ | sort; test "$TREB_ATTEMPT" = 1 || { test "$RANK" = 0 || sleep 30; exit 1; }'
procs_per_node: 2
retries: 1
tracking:
  wandb: {project: proj, entity: team}
""")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    want = {"WANDB_RUN_ID": f"treb-{st['id']}", "WANDB_RESUME": "allow", "WANDB_NAME": "wb",
            "WANDB_PROJECT": "proj", "WANDB_ENTITY": "team"}  # fmt: skip
    # attempt 0: rank 0 prints, then fails (rank 1 is stopped, maybe before it printed)
    for attempt, rank in ((0, 0), (1, 0), (1, 1)):
        log = Path(st["run_dir"]) / f"attempt-{attempt}" / f"rank-{rank}.log"
        got = dict(line.split("=", 1) for line in log.read_text().split())
        assert got == want, (attempt, rank, got)
    assert "WANDB_RUN_GROUP" not in want  # a single run has no group; a sweep's: below


def test_wandb_group_is_the_sweep_id(treb, tmp_path) -> None:
    spec = write_spec(tmp_path / "w", """
name: wbs
command: 'echo "group=$WANDB_RUN_GROUP id=$WANDB_RUN_ID"'
tracking: {wandb: {}}
""")  # fmt: skip
    res = treb("run", str(spec), "--sweep", "-o", "env.X=1,2", "-o", "sweep_parallel=2")
    assert res.returncode == 0, res.stderr
    runs = json.loads(treb("ps", "--all", "--json").stdout)
    assert len(runs) == 2 and len({r["sweep_id"] for r in runs}) == 1
    for r in runs:
        log = (Path(r["run_dir"]) / "attempt-0" / "rank-0.log").read_text()
        assert f"group={r['sweep_id']} id=treb-{r['id']}" in log


def test_digits_ddp_metrics_are_the_same_in_treb_the_dashboard_and_mlflow(
    treb, tmp_path, mlflow_server
) -> None:
    """Issue 14's "done": digits-ddp's loss and accuracy, as rank 0 printed them, in
    `treb metrics`, in the data of the dashboard's charts and in MLflow."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    digits = REPO / "examples" / "digits-ddp" / "job.yaml"
    res = treb("run", str(digits), "-o", "command=python train.py --epochs 4",
               "-o", f"tracking.mlflow.uri={mlflow_server}", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    printed = {int(s): float(v) for s, v in re.findall(r"^\[0:0\] epoch (\d+) loss ([0-9.]+)$",
                                                       res.stdout, re.M)}  # fmt: skip
    accuracy = float(re.search(r"^\[0:0\] accuracy: ([0-9.]+)$", res.stdout, re.M)[1])
    assert sorted(printed) == [1, 2, 3, 4]
    st = status_json(treb)
    got = json.loads(treb("metrics", st["id"], "--json").stdout)["metrics"]
    assert {int(s): v for s, v, _ in got["loss"]["points"]} == printed
    assert got["accuracy"]["last"]["value"] == accuracy
    # the dashboard's run page carries the same series for its charts
    pytest.importorskip("starlette")
    from trebuchet.store.db import Store
    from trebuchet.ui.pages import run_page

    store = Store()
    page = run_page(store, store.get(st["id"]), "csrf")
    chart = json.loads(re.search(r'id="metrics-data">(.*?)</script>', page)[1])
    assert dict(zip(map(int, chart["loss"]["x"]), chart["loss"]["y"], strict=True)) == printed
    assert chart["accuracy"]["y"][-1] == accuracy
    # and MLflow has them, step for step
    run = wait_status(mlflow_server, st["run_dir"])
    assert run["status"] == "FINISHED"
    rid = tracking_of(st["run_dir"])["mlflow"]["run_id"]
    hist = api(mlflow_server, "metrics/get-history", run_id=rid, metric_key="loss")["metrics"]
    assert {m["step"]: m["value"] for m in hist} == printed
    assert run["metrics"]["accuracy"] == accuracy
