"""A node lost while its ranks run, on the real test cluster (issue 23, its first part:
the loss noticed in seconds and named). Every process in the second node's network
namespace is killed after its link is taken down, as when a machine dies: no FIN, no
error from srun. Before the agents' heartbeat (runtime/agent_link.py) the run stayed
RUNNING without a word until Slurm gave up on the node (SlurmdTimeout, 300 s by default).

Spares and exclusion (the next attempt elsewhere) are not built yet: without them a lost
node ends the run FAILED with its cause, retries or not.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    CLUSTER,
    slurm_conf,
    status,
    streb,
    wait_for,
    wait_ranks_running,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

LOOP = "python3 -c 'import time\nfor i in range(600): print(i, flush=True); time.sleep(1)'"


def kill_node(name: str) -> None:
    """The node's link down first (nothing it sends gets out), then every process in its
    namespace (slurmd, the step, the agent, the rank) killed."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                          timeout=30).stdout.split()  # fmt: skip
    subprocess.run(["ip", "link", "set", f"treb-{name}", "down"], check=True, timeout=30)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture
def node_to_lose(slurm_conf: str) -> Iterator[str]:
    """tn2, and the whole cluster brought back afterwards (`cluster.sh up` rebuilds what is
    not healthy), so that the tests after this one find it as before."""
    yield "tn2"
    subprocess.run(["ip", "link", "set", "treb-tn2", "up"], timeout=30)
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    res = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_dead_node_ends_the_attempt_in_seconds_naming_it(
    streb, node_to_lose: str, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, f"name: loses-a-node\nnodes: 2\nretries: 1\nnode_timeout: 6s\n"
                                f"command: {LOOP!r}\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=120)
    wait_ranks_running(st["run_dir"], 2)
    time.sleep(3)  # a heartbeat or two from each agent on record
    killed_at = time.time()
    kill_node(node_to_lose)

    st = wait_for(streb, rid, {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}, 180)
    took = time.time() - killed_at
    print(f"node killed -> run ended: {took:.1f}s (node_timeout 6s)")
    print((Path(st["run_dir"]) / "batch.log").read_text())
    assert st["state"] == "FAILED", st
    ff = st["first_failure"]
    assert ff["label"] == "node_lost" and ff["host"] == node_to_lose, ff
    assert ff["message"].startswith(f"node_lost: {node_to_lose} (no heartbeat for 6s"), ff
    assert [a["state"] for a in st["attempts"]] == ["FAILED"], st["attempts"]  # no spare
    shown = streb("status", rid)
    assert f"node_lost: {node_to_lose}" in shown.stdout, shown.stdout
    events = (Path(st["run_dir"]) / "events.jsonl").read_text()
    batch = (Path(st["run_dir"]) / "batch.log").read_text()
    assert f"node_lost: {node_to_lose}" in batch, batch
    assert '"node_lost"' in events or "node_lost" in batch
