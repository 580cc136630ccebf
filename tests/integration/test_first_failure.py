"""Issue 33, high 5: the first failure of an attempt, once recorded, is final. A later event
(a node lost during the teardown, a preemption) never rewrites the cause, and the exit-code
rules judge only a program's exit. Real local runs on 2 simulated nodes, `treb fault`.
Outcomes only, never times."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_recovery_local import events, wait_end

pytestmark = pytest.mark.integration
PY = sys.executable

# Rank 0 waits for the test's `go`, then exits 7; rank 1 ignores SIGTERM (a long teardown).
STUBBORN = """\
import os, signal, sys, time
run = os.environ['TREB_RUN_DIR']
rank = os.environ['RANK']
if rank == '1':
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(run, 'ready-' + rank), 'w').close()
while rank == '0' and not os.path.exists(os.path.join(run, 'go')):
    time.sleep(0.05)
if rank == '0':
    sys.exit(7)
time.sleep(300)
"""

# Attempt 0 runs until it is preempted; a retry succeeds.
PREEMPTED = """\
import os, time
run = os.environ['TREB_RUN_DIR']
if os.environ['TREB_ATTEMPT'] == '0':
    open(os.path.join(run, 'ready-' + os.environ['RANK']), 'w').close()
    time.sleep(300)
"""


def wait_for(what, why: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def start(treb, tmp_path: Path, script: str, extra: str) -> tuple[str, Path]:
    (tmp_path / "r.py").write_text(script)
    spec = write_spec(tmp_path, f"command: [{PY}, r.py]\nnodes: 2\n{extra}")
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    run_dir = Path(st["run_dir"])
    wait_for(lambda: all((run_dir / f"ready-{r}").exists() for r in (0, 1)), "no start")
    return st["id"], run_dir


def test_a_node_lost_in_the_teardown_does_not_rewrite_the_cause(treb, tmp_path: Path) -> None:
    """Rank 0 exits 7 (no_retry_exit_codes), rank 1 ignores SIGTERM, node 1 is killed
    during the teardown: the cause stays rank 0's exit 7, and the run is not retried."""
    extra = "retries: 2\nspare_nodes: 1\nno_retry_exit_codes: [7]\ngrace_period: 30s\n"
    run, run_dir = start(treb, tmp_path, STUBBORN, extra)
    (run_dir / "go").touch()
    wait_for(lambda: "teardown" in {e["event"] for e in events(run_dir)}, "no teardown")
    assert treb("fault", run, "kill-node", "1").returncode == 0
    st = wait_end(treb, run)
    assert st["state"] == "FAILED", st
    ff = st["first_failure"]
    assert (ff["rank"], ff["exit_code"]) == (0, 7), ff
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [
        ("FAILED", "no_retry_exit_codes: no_retry")], st["attempts"]  # fmt: skip
    # the node is still known lost (excluded for any later attempt), only not the cause
    assert (run_dir / "excluded-nodes").read_text().startswith("node-1\t")
    diag = treb("diagnose", run)
    assert "node_lost" not in diag.stdout.split("category:")[1].splitlines()[0], diag.stdout


def test_a_preemption_is_left_to_retries(treb, tmp_path: Path) -> None:
    """retry_exit_codes judge a program's exit; a preemption (SIGTERM from outside) is
    retried by `retries` (docs/recovery.md)."""
    run, run_dir = start(treb, tmp_path, PREEMPTED, "retries: 2\nretry_exit_codes: [3]\n")
    assert treb("fault", run, "preempt").returncode == 0
    st = wait_end(treb, run)
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"], st["attempts"]
    assert st["state"] == "SUCCEEDED"
    kinds = [e["event"] for e in events(run_dir)]
    assert "log_policy" not in kinds, kinds


# Rank 1 ignores SIGTERM: the timeout's teardown lasts until node 1 dies.
DEAF = """\
import os, signal, time
if os.environ['RANK'] == '1':
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(os.path.join(os.environ['TREB_RUN_DIR'], 'ready-' + os.environ['RANK']), 'w').close()
time.sleep(300)
"""


def test_a_node_lost_in_the_timeouts_teardown_is_no_cause(treb, tmp_path: Path) -> None:
    """The controller stopped the attempt (its timeout): a node that dies during that
    teardown is recorded and excluded, but the attempt stays TIMEOUT with no failure."""
    extra = "timeout: 3s\nretries: 0\nspare_nodes: 1\ngrace_period: 30s\n"
    run, run_dir = start(treb, tmp_path, DEAF, extra)
    wait_for(lambda: "teardown" in {e["event"] for e in events(run_dir)}, "no teardown")
    assert treb("fault", run, "kill-node", "1").returncode == 0
    st = wait_end(treb, run)
    assert st["state"] == "TIMEOUT", st
    assert st["first_failure"] is None, st["first_failure"]
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("TIMEOUT", "timeout")]
    lost = [e for e in events(run_dir) if e["event"] == "node_lost"]
    assert [(e["host"], e.get("after_first_failure")) for e in lost] == [("node-1", True)]
