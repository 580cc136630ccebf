"""Issue 23 over ssh, on the real test hosts (ts1, ts2: network namespaces with their own
sshd and hostnames, one filesystem and PID space): a host whose health_check fails starts
no rank, is named as the cause and excluded by its ssh name; `treb fault kill-node` and
`hang-rank` with the outcomes they must have. The copy path (ssh.shared_dir: none): the
records travel back with the attempt's folder. Outcomes only, never times.
"""

# ruff: noqa: F811 (pytest fixtures imported from test_ssh_runs are named as arguments)
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, status_json
from tests.integration.test_ssh_runs import (  # noqa: F401 (fixtures)
    assert_nothing_left,
    detached,
    ranks_started,
    spec,
    ssh_config,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.ssh]
ENDED = {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}
SICK = '[ "$NODE_RANK" != 1 ] || { echo "no scratch on $(hostname)"; exit 3; }'


def ended(treb: TrebFn, run: str) -> dict:
    wait_for(lambda: status_json(treb, run)["state"] in ENDED, 180, f"run {run} to end")
    return status_json(treb, run)


def events(run_dir: str) -> list[dict]:
    return [json.loads(ln) for ln in (Path(run_dir) / "events.jsonl").read_text().splitlines()]


def test_an_unhealthy_host_starts_no_rank(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    path = spec(tmp_path, ssh_config, "sleep 30", f"health_check: {json.dumps(SICK)}\n")
    run = detached(treb, path)
    st = ended(treb, run)
    assert st["state"] == "FAILED", st
    ff = st["first_failure"]
    assert (ff["label"], ff["node"], ff["host"]) == ("node_unhealthy", 1, "ts2"), ff
    assert "user: health_check exited with code 3: no scratch on ts2" in ff["message"]
    adir = Path(st["run_dir"]) / "attempt-0"
    assert not (adir / "rank-2.json").exists() and not (adir / "rank-3.json").exists()
    assert (adir / "health-1.log").read_text() == "no scratch on ts2\n"
    # node 0's checks may still run when node 1's failure stops the attempt (then it has no
    # record: 1 run in 6-8 here, the first after the hosts start); where they ended, healthy
    found = {h["node"]: h["healthy"] for h in st["health"]["1"]}
    assert found[1] is False and found.get(0, True) is True, st["health"]
    assert (Path(st["run_dir"]) / "excluded-nodes").read_text().startswith("ts2\t")
    assert_nothing_left(run)


def test_fault_kill_node_over_ssh(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    path = spec(tmp_path, ssh_config, "sleep 300", "node_timeout: 5s\n")
    run = detached(treb, path)
    wait_for(lambda: ranks_started(run), 120, "the agents and ranks on both hosts")
    time.sleep(2)
    res = treb("fault", run, "kill-node", "ts2")
    assert res.returncode == 0, res.stdout + res.stderr
    st = ended(treb, run)
    assert st["state"] == "FAILED", st
    ff = st["first_failure"]
    assert ff.get("host") == "ts2" or "ts2" in str(ff.get("message")), ff
    said = [e for e in events(st["run_dir"]) if e["event"] == "fault"]
    assert [(e["fault"], e["host"]) for e in said] == [("kill-node", "ts2")]
    assert_nothing_left(run)


def test_fault_hang_rank_over_ssh(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    # two ranks in lockstep through files both hosts see: one stopped stops the other
    lock = tmp_path / "lock"
    lock.mkdir()
    prog = REPO / "tests" / "integration" / "scripts" / "lockstep.py"
    path = spec(tmp_path, ssh_config, f"python3 {prog}",
                f"hang_timeout: 6s\nenv:\n  LOCK: {lock}\n")  # fmt: skip
    text = path.read_text().replace("procs_per_node: 2", "procs_per_node: 1")
    path.write_text(text)
    run = detached(treb, path)
    wait_for(lambda: (lock / "tick-1").exists() and int((lock / "tick-1").read_text() or 0) > 2,
             120, "the ranks in step")  # fmt: skip
    res = treb("fault", run, "hang-rank", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    st = ended(treb, run)
    assert st["state"] == "FAILED" and st["attempts"][0]["reason"] == "hang", st
    assert_nothing_left(run)
