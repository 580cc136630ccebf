"""Issue 23 on the local engine, real processes (2 simulated nodes, torch/gloo): a node
whose health_check fails starts no rank and ends the attempt as a lost node would; the
exit-code rules; `treb fault` kill-node, hang-rank and preempt with the outcomes they
must have. Outcomes only, never times.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, status_json, write_spec
from tests.integration.test_faults import assert_no_survivors

pytestmark = pytest.mark.integration
PY = sys.executable
TRAIN = REPO / "tests" / "integration" / "scripts" / "fault_train.py"


def events(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]


def test_a_failing_health_check_starts_no_rank(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"command: [{PY}, -c, 'print(1)']\nnodes: 2\nretries: 0\n"
                      "health_check: '[ \"$NODE_RANK\" != 1 ] || { echo no scratch; exit 4; }'\n")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    ff = st["first_failure"]
    assert (ff["label"], ff["node"], ff["host"]) == ("node_unhealthy", 1, "node-1")
    assert "user: health_check exited with code 4: no scratch" in ff["message"]
    run_dir = Path(st["run_dir"])
    adir = run_dir / "attempt-0"
    assert not list(adir.glob("rank-*")), "a rank started"
    assert (adir / "health-1.log").read_text() == "no scratch\n"
    healths = st["health"]["1"]
    assert [(h["node"], h["healthy"]) for h in healths] == [(0, True), (1, False)]
    assert (run_dir / "excluded-nodes").read_text().startswith("node-1\tnode_unhealthy: ")
    assert "node_unhealthy" in {e["event"] for e in events(run_dir)}
    shown = treb("status")
    assert "node 1 node-1: UNHEALTHY (user: health_check exited with code 4" in shown.stdout
    diag = treb("diagnose")
    assert "category: node_unhealthy" in diag.stdout


def test_a_health_check_that_leaves_a_background_process(treb, tmp_path: Path) -> None:
    """Issue 33: the check's own exit status counts, not its output pipe (which the
    background child holds open): both nodes are healthy at once, the run succeeds, and
    the check's leftover is ended with it."""
    spec = write_spec(tmp_path, f"command: [{PY}, -c, 'print(1)']\nnodes: 2\n"
                      "health_check: '(sleep 300) & echo checked; exit 0'\n"
                      "health_check_timeout: 10s\n")  # fmt: skip
    res = treb("run", str(spec), timeout=120)
    st = status_json(treb)
    assert res.returncode == 0, (res.stderr, st.get("health"))
    assert [(h["node"], h["healthy"]) for h in st["health"]["1"]] == [(0, True), (1, True)]
    assert not (Path(st["run_dir"]) / "excluded-nodes").exists()
    assert (Path(st["run_dir"]) / "attempt-0" / "health-1.log").read_text() == "checked\n"
    assert_no_survivors(st["id"])


def test_exit_code_rules_on_a_real_run(treb, tmp_path: Path) -> None:
    code = "import os, sys; sys.exit(int(os.environ['CODES'].split()[int(os.environ['TREB_ATTEMPT'])]))"
    spec = write_spec(tmp_path, f"command: [{PY}, -c, \"{code}\"]\nretries: 3\n"
                      "no_retry_exit_codes: [3]\nenv:\n  CODES: '1 3 0 0'\n")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 1
    st = status_json(treb)
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "FAILED"]  # 3: no more
    assert st["attempts"][1]["reason"] == "no_retry_exit_codes: no_retry"
    spec = write_spec(tmp_path, f"command: [{PY}, -c, \"{code}\"]\nretries: 3\n"
                      "retry_exit_codes: [75]\nenv:\n  CODES: '75 75 0 0'\n")  # fmt: skip
    assert treb("run", str(spec)).returncode == 0
    assert [a["state"] for a in status_json(treb)["attempts"]] == ["FAILED", "FAILED",
                                                                   "SUCCEEDED"]  # fmt: skip


def start_training(treb, tmp_path: Path, extra: str) -> tuple[str, Path]:
    """A detached 2-node run of fault_train.py, once every rank of attempt 0 is ready."""
    shutil.copy(TRAIN, tmp_path / "fault_train.py")
    spec = write_spec(tmp_path, f"command: [{PY}, fault_train.py]\nnodes: 2\n{extra}")
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    run_dir = Path(st["run_dir"])
    deadline = time.time() + 240
    while not all((run_dir / f"ready-0-{r}").exists() for r in (0, 1)):
        assert time.time() < deadline, "the ranks never got going"
        assert status_json(treb)["state"] in ("PENDING", "RUNNING"), status_json(treb)
        time.sleep(0.5)
    return st["id"], run_dir


def wait_end(treb, run: str) -> dict:
    deadline = time.time() + 240
    while True:
        st = status_json(treb, run)
        if st["state"] not in ("PENDING", "RUNNING", "RETRYING"):
            return st
        assert time.time() < deadline, st
        time.sleep(0.5)


def test_fault_kill_node_then_the_retry(treb, tmp_path: Path) -> None:
    # a lost node needs a spare to go on (without one the run ends FAILED: docs/recovery.md)
    run, run_dir = start_training(treb, tmp_path, "retries: 1\nspare_nodes: 1\n")
    res = treb("fault", run, "kill-node", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    st = wait_end(treb, run)
    assert st["state"] == "SUCCEEDED", st
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    killed = json.loads((run_dir / "attempt-0" / "rank-1.json").read_text())
    assert (killed["node"], killed["signal"]) == (1, "SIGKILL")
    fault = [e for e in events(run_dir) if e["event"] == "fault"]
    assert [(f["fault"], f["node"], f["host"]) for f in fault] == [("kill-node", 1, "node-1")]


def test_fault_hang_rank_is_found_by_the_hang_watch(treb, tmp_path: Path) -> None:
    run, run_dir = start_training(treb, tmp_path, "hang_timeout: 5s\non_hang: fail\n")
    assert treb("fault", run, "hang-rank", "1").returncode == 0
    st = wait_end(treb, run)
    assert st["state"] == "FAILED" and st["attempts"][0]["reason"] == "hang", st
    kinds = [e["event"] for e in events(run_dir)]
    assert "fault" in kinds and "hang" in kinds and kinds.index("fault") < kinds.index("hang")


def test_fault_preempt_locally_is_a_sigterm_from_outside(treb, tmp_path: Path) -> None:
    run, run_dir = start_training(treb, tmp_path, "retries: 1\n")
    assert treb("fault", run, "preempt").returncode == 0
    st = wait_end(treb, run)
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"], st
    recs = [json.loads(p.read_text()) for p in (run_dir / "attempt-0").glob("rank-*.json")]
    assert "SIGTERM" in {r.get("signal") for r in recs}


def test_fault_refuses_bad_input(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"command: [{PY}, -c, 'print(1)']\n")
    assert treb("run", str(spec)).returncode == 0
    res = treb("fault", status_json(treb)["id"], "kill-node", "0")
    assert res.returncode == 2 and "not running" in res.stderr
