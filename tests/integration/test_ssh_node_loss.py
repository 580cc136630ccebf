"""A host lost while its ranks train over ssh (issue 23), on three real sshd hosts
(tests/ssh_hosts/hosts.sh with TREB_SSH_HOST_COUNT=3: the third is brought up here). The
host dies as a machine does: its link taken down first (nothing it sends gets out), then
every process in its network namespace SIGKILLed (its sshd, the node agent, the rank). No
FIN reaches the supervisor's ssh client: the agents' heartbeat on the session's stdout
(runtime/job/nodeloss.py) decides, after node_timeout.

The run directory is shared (the hosts share this machine's disk, detected as such), so
TREB_CHECKPOINT_DIR is the same folder for every host, as a real cluster's shared storage.
"""

# ruff: noqa: F811 (the ssh_config fixture is imported and named as an argument)
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, needs, status_json, write_spec
from tests.dead_machine import kill_namespace
from tests.integration.test_ssh_runs import HOSTS, PY, assert_nothing_left, wait_for
from tests.integration.test_ssh_runs import ssh_config as ssh_config  # noqa: F401 (fixture)
from trebuchet.store.files import read_events

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

TRAIN = REPO / "tests" / "integration" / "scripts" / "ckpt_train.py"
HOST_IP = {"ts1": "10.78.0.11", "ts2": "10.78.0.12", "ts3": "10.78.0.13"}


def hosts_up(count: int) -> None:
    env = {**os.environ, "TREB_SSH_HOST_COUNT": str(count)}
    res = subprocess.run(["bash", str(HOSTS), "up"], capture_output=True, text=True, env=env,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]


def kill_host(name: str) -> None:
    kill_namespace(name, f"tssh-{name}")


@pytest.fixture
def three_hosts(ssh_config: str) -> Iterator[str]:
    """ts1..ts3 up; a host a test killed is brought back afterwards (its link, its sshd)."""
    if os.getuid() != 0:
        pytest.skip("killing a test host needs root")
    hosts_up(3)
    yield ssh_config
    for h in ("ts1", "ts2", "ts3"):
        subprocess.run(["ip", "link", "set", f"tssh-{h}", "up"], timeout=30)
    hosts_up(3)


def job(tmp_path: Path, conf: str, nodes: str, extra: str = "") -> Path:
    work = tmp_path / "job"
    work.mkdir(exist_ok=True)
    shutil.copy(TRAIN, work / "ckpt_train.py")
    return write_spec(work, f"""\
name: ssh-node-loss
command: "exec {PY} ckpt_train.py 40 0.3"
nodes: {nodes}
grace_period: 2
node_timeout: 5s
retries: 1
env: {{GLOO_SOCKET_IFNAME: eth0}}
ssh: {{hosts: [ts1, ts2, ts3], config_file: {conf}}}
{extra}""")  # fmt: skip


def started(ckpt: Path, attempt: int) -> list[dict]:
    """What each rank of `attempt` said at its start (ckpt_train.py), by rank."""
    found = sorted(ckpt.glob(f"start-{attempt}-*.json"))
    return [json.loads(p.read_text()) for p in found]


def train_then_kill(treb: TrebFn, spec: Path, victim: str) -> tuple[str, Path]:
    """Start the run, let it checkpoint a few steps, kill `victim`; (run id, ckpt dir)."""
    res = treb("run", str(spec), "--on", "ssh", "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    rid, ckpt = st["id"], Path(st["run_dir"]) / "checkpoints"

    def trained() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((ckpt / "ckpt.json").read_text())["step"] >= 3
        return False

    wait_for(trained, 120, "3 checkpointed steps")
    kill_host(victim)
    wait_for(lambda: status_json(treb, rid)["state"] in ("SUCCEEDED", "FAILED"), 180, "the end")
    return rid, ckpt


def test_lost_host_is_replaced_by_the_spare_and_training_resumes(
    treb: TrebFn, three_hosts: str, tmp_path: Path
) -> None:
    needs("torch")
    rid, ckpt = train_then_kill(treb, job(tmp_path, three_hosts, "2", "spare_nodes: 1\n"), "ts2")
    st = status_json(treb, rid)
    assert st["state"] == "SUCCEEDED", st
    first, second = st["attempts"][0], st["attempts"][1]
    assert second["state"] == "SUCCEEDED", second
    assert first["state"] == "FAILED" and first["reason"].startswith(
        "node_lost: ts2 (no heartbeat"
    ), first
    # attempt 1 ran on the survivor and the spare, node 0 still ts1, resumed from the checkpoint
    ranks = started(ckpt, 1)
    assert [(r["host"], r["node_rank"], r["world"]) for r in ranks] == [
        ("ts1", 0, 2),
        ("ts3", 1, 2),
    ]
    assert all(r["resumed_from"] > 3 and r["master"] == HOST_IP["ts1"] for r in ranks), ranks
    assert json.loads((ckpt / "ckpt.json").read_text())["step"] == 39
    run_dir = Path(st["run_dir"])
    lost = json.loads((run_dir / "attempt-0" / "lost-1.json").read_text())
    assert lost["label"] == "node_lost" and lost["host"] == "ts2", lost
    assert (run_dir / "excluded-nodes").read_text().startswith("ts2\tnode_lost: ts2")
    [event] = [e for e in read_events(run_dir) if e["event"] == "node_lost"]
    assert event["host"] == "ts2" and event["attempt"] == 0
    out = treb("status", rid).stdout
    assert "node_lost: ts2" in out, out
    assert_nothing_left(rid)


def test_elastic_range_goes_on_with_fewer_nodes_and_the_master_moves(
    treb: TrebFn, three_hosts: str, tmp_path: Path
) -> None:
    """nodes: "2:3", no spare, node 0 (ts1, the master) lost: the next attempt runs on ts2
    and ts3, WORLD_SIZE 2, MASTER_ADDR ts2's."""
    needs("torch")
    rid, ckpt = train_then_kill(treb, job(tmp_path, three_hosts, '"2:3"'), "ts1")
    st = status_json(treb, rid)
    assert st["state"] == "SUCCEEDED", st
    assert [r["world"] for r in started(ckpt, 0)] == [3, 3, 3]
    ranks = started(ckpt, 1)
    assert [(r["host"], r["node_rank"], r["env_world"]) for r in ranks] == [
        ("ts2", 0, 2),
        ("ts3", 1, 2),
    ]
    assert all(r["master"] == HOST_IP["ts2"] and r["resumed_from"] > 3 for r in ranks), ranks
    assert st["attempts"][0]["reason"].startswith("node_lost: ts1"), st["attempts"]


def test_no_spare_and_no_range_ends_the_run_with_the_lost_node(
    treb: TrebFn, three_hosts: str, tmp_path: Path
) -> None:
    """nodes: 3 on 3 hosts, retries: 1 but no spare: nothing to go on with, FAILED."""
    spec = write_spec(tmp_path / "job", f"""\
name: ssh-node-loss-final
command: "exec sleep 300"
nodes: 3
grace_period: 2
node_timeout: 5s
retries: 1
ssh: {{hosts: [ts1, ts2, ts3], config_file: {three_hosts}}}
""")  # fmt: skip
    res = treb("run", str(spec), "--on", "ssh", "--detach")
    assert res.returncode == 0, res.stderr
    rid = status_json(treb)["id"]
    run_dir = Path(status_json(treb, rid)["run_dir"])
    wait_for(lambda: len(list((run_dir / "attempt-0").glob("rank-*.json"))) >= 3, 60, "3 ranks")
    time.sleep(1)
    kill_host("ts3")
    wait_for(lambda: status_json(treb, rid)["state"] in ("SUCCEEDED", "FAILED"), 120, "the end")
    st = status_json(treb, rid)
    assert st["state"] == "FAILED" and len(st["attempts"]) == 1, st
    assert st["first_failure"]["label"] == "node_lost", st["first_failure"]
    assert st["first_failure"]["message"].startswith("node_lost: ts3 (no heartbeat for 5s"), st
