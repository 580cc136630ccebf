"""The MLflow client's deadline and the pending file, against slow servers on real sockets
(tests/slow_http.py: a server that trickles its answer one byte at a time, or answers
late). The whole flow against the real MLflow server is in
tests/integration/test_tracking.py."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.slow_http import RUN_ID, Canned
from trebuchet.runtime.publish import trackers as rt
from trebuchet.runtime.publish.mlflow_rest import Mlflow, MlflowError


@pytest.fixture
def server():
    s = Canned()
    yield s
    s.close()


def _bounded(fn, limit: float):
    """fn() in a thread, which must end within `limit` s (a hang fails the test, not the
    suite); its exception or result."""
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"still waiting on the server after {limit} s"
    return box, time.monotonic() - t0


def test_a_trickling_server_is_left_at_the_deadline(server) -> None:
    """One byte every 0.2 s: no socket timeout ever fires; the deadline does."""
    server.mode = "trickle"
    client = Mlflow(server.uri, timeout=1.0)
    box, took = _bounded(lambda: client.api("GET", "experiments/get-by-name"), 10)
    assert isinstance(box.get("error"), MlflowError) and box["error"].unreachable
    assert "did not answer within 1 s" in str(box["error"])
    assert took < 2.0


def test_the_budget_is_for_all_requests_together(server) -> None:
    """A server answering each request in 0.4 s: five requests do not get 5 x the budget."""
    server.mode, server.delay_s = "delay", 0.4
    client = Mlflow(server.uri, timeout=1.0)

    def five() -> None:
        for _ in range(5):
            client.api("POST", "runs/log-batch", {})

    box, took = _bounded(five, 10)
    assert isinstance(box.get("error"), MlflowError)
    assert took < 1.5 and len(server.requests) <= 3
    # spent: the next request fails at once, without asking the server
    asked = len(server.requests)
    with pytest.raises(MlflowError, match="did not answer within"):
        client.api("POST", "runs/log-batch", {})
    assert len(server.requests) == asked


def _tracked_run_dir(tmp_path: Path, uri: str) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    info = {"mlflow": {"uri": uri, "experiment_id": "1", "run_id": RUN_ID,
                       "artifact_uri": f"mlflow-artifacts:/1/{RUN_ID}/artifacts"}}  # fmt: skip
    (run_dir / rt.FILE).write_text(json.dumps(info))
    return run_dir


def test_mark_sends_the_status_first(tmp_path, server) -> None:
    run_dir = _tracked_run_dir(tmp_path, server.uri)
    assert rt.mark(str(run_dir), "FAILED", "rank 1 exited with code 3")
    assert server.paths() == ["/api/2.0/mlflow/runs/update", "/api/2.0/mlflow/runs/log-batch"]
    assert server.bodies("runs/update")[0]["status"] == "FAILED"
    assert not (run_dir / rt.PENDING).exists()


def test_mark_that_times_out_keeps_the_status_for_later(tmp_path, server) -> None:
    """The Slurm controller's end: bounded, and what did not get through is kept."""
    run_dir = _tracked_run_dir(tmp_path, server.uri)
    server.mode = "hang"
    box, took = _bounded(lambda: rt.mark(str(run_dir), "SUCCEEDED", "", timeout=0.5), 10)
    assert box["result"] is False and took < 1.5
    kept = rt.pending(str(run_dir))
    assert kept["status"]["state"] == "SUCCEEDED" and "did not answer" in kept["error"]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["tracking_failed"]
    # a requeue's RUNNING, then the final state: the last one is what is sent later
    rt.mark(str(run_dir), "RUNNING", "requeued", timeout=0.3)
    assert rt.pending(str(run_dir))["status"]["state"] == "RUNNING"
    server.mode = "pass"
    assert rt.mark(str(run_dir), "SUCCEEDED")
    assert "status" not in rt.pending(str(run_dir))  # settled: a later status got through


def test_pending_items_merge_and_settle(tmp_path) -> None:
    d = str(tmp_path)
    late = rt.status_item("SUCCEEDED", at=200.0)
    early = rt.status_item("RUNNING", at=100.0)
    rt.defer(d, {"status": late, "tags": [["a", "1"]]})
    rt.defer(d, {"status": early, "tags": [["a", "1"], ["b", "2"]], "metrics": {"sent": 0}})
    kept = rt.pending(d)
    assert kept["status"]["state"] == "SUCCEEDED"  # an older status never replaces a newer
    assert kept["tags"] == [["a", "1"], ["b", "2"]]
    rt.settle(d, "tags", [["a", "1"]])
    assert rt.pending(d)["tags"] == [["b", "2"]]
    rt.settle(d, "status", early)  # not the one kept: stays
    assert rt.pending(d)["status"]["state"] == "SUCCEEDED"
    for key, value in (("status", late), ("tags", [["b", "2"]]), ("metrics", None)):
        rt.settle(d, key, value)
    assert not (tmp_path / rt.PENDING).exists()  # nothing left: no file


def test_only_answers_that_would_change_are_tried_again() -> None:
    """A request the server refused (400: a param changed) is not sent again and again;
    no answer, an overloaded server (429, 5xx) are."""
    assert MlflowError("x", status=400).lasting and MlflowError("x", status=404).lasting
    for err in (MlflowError("x", True), MlflowError("x", status=429),
                MlflowError("x", status=503), MlflowError("not JSON")):  # fmt: skip
        assert not err.lasting
