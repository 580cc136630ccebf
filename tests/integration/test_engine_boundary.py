"""`treb run --on skypilot` and `--on kubernetes` through to their nodes: what the render
puts on a node (the task's `setup:` and `run:`, the pod's command with the node agent from
the ConfigMap) runs on the ssh test hosts (network namespaces with their own addresses),
with exactly the environment those engines give, 2 nodes x 2 ranks of real torch gloo.

The engines' control planes cannot run here: tests/stand_ins/ holds test doubles of the
`sky` and `kubernetes` SDKs that treb imports, which run the nodes through
tests/engine_hosts.py (its docstring says what each engine does to a node, from the
engines' sources and docs) and keep the nodes' output as the engine's log API returns it.
Everything on the nodes is real: the runtime archive, job.json, the ranks, gloo over the
hosts' addresses, the first-failure teardown and the records the node agents write.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.conftest import TrebFn, needs, status_json, write_spec
from tests.engine_hosts import REPO, STAND_INS
from tests.integration.test_ssh_runs import ssh_config  # noqa: F401
from trebuchet.store.files import read_events

pytestmark = pytest.mark.integration

RANKS = """\
import json, os, socket, sys, time
import torch
import torch.distributed as dist

NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
         "MASTER_ADDR", "MASTER_PORT", "TREB_RUN_ID", "TREB_ATTEMPT", "SKYPILOT_NODE_RANK",
         "JOB_COMPLETION_INDEX", "SECRET_SEEN")
seen = {n: os.environ.get(n) for n in NAMES}
seen.update(host=socket.gethostname(), cwd=os.getcwd())
print("contract", json.dumps(seen, sort_keys=True), flush=True)
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print("all_reduce", int(total.item()), "of", dist.get_world_size(), flush=True)
fail = os.environ.get("FAIL_RANK")
if fail:
    if int(fail) == dist.get_rank():
        raise ValueError(f"rank {fail} fails on purpose")
    time.sleep(600)  # the others wait: the engine's teardown must end them
dist.destroy_process_group()
"""


def job(tmp_path: Path, fail: str = "", extra: str = "") -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "ranks.py").write_text(RANKS)
    env = f"GLOO_SOCKET_IFNAME: eth0, SECRET_SEEN: '${{BOUNDARY_TOKEN}}', FAIL_RANK: '{fail}'"
    return write_spec(work, f"""\
name: boundary
command: python ranks.py
nodes: 2
procs_per_node: 2
grace_period: 3s
env: {{{env}}}
secrets: [BOUNDARY_TOKEN]
{extra}""")  # fmt: skip


@pytest.fixture
def engine_env(tmp_path: Path, ssh_config: str) -> dict[str, str]:  # noqa: F811
    """The environment of a `treb` whose `sky`/`kubernetes` are the stand-ins (the test
    hosts are up: ssh_config); their state in tmp_path/control-plane, where the Secret the
    user would create with kubectl is too."""
    needs("torch")
    plane = tmp_path / "control-plane"
    (plane / "default" / "secrets").mkdir(parents=True)
    (plane / "default" / "secrets" / "boundary.json").write_text('{"BOUNDARY_TOKEN": "s3cret"}')
    path = os.pathsep.join([str(STAND_INS), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "TREB_STAND_IN_DIR": str(plane), "BOUNDARY_TOKEN": "s3cret"}


def contracts(text: str) -> list[dict]:
    return [json.loads(line.split("contract ", 1)[1]) for line in text.splitlines()
            if line.startswith("contract ")]  # fmt: skip


def record(run_dir: Path, rank: int) -> dict:
    return json.loads((run_dir / "attempt-0" / f"rank-{rank}.json").read_text())


def node_run_dir(tmp_path: Path, engine: str, run_id: str, node: int) -> Path:
    """Node `node`'s own run directory, where the stand-in put its HOME or its emptyDir."""
    plane = tmp_path / "control-plane"
    if engine == "skypilot":
        return plane / f"treb-{run_id}" / f"node-{node}" / ".trebuchet" / "runs" / run_id
    return (
        plane / "default" / "pods" / f"boundary-{run_id}" / f"pod-{node}" / "volumes" / "treb-run"
    )


ON = {"skypilot": ["--on", "skypilot"],
      "kubernetes": ["--on", "kubernetes", "-o", "kubernetes.image=python:3.12-slim"]}  # fmt: skip


def expected(engine: str, run_id: str, rank: int, tmp_path: Path) -> dict:
    """What rank `rank` must see: the contract, on the host and in the folder its engine
    gives it (SkyPilot: the head's IP, ~/sky_workdir; Kubernetes: pod 0's Service name,
    the code unpacked into /treb-code)."""
    node, local = divmod(rank, 2)
    sky = engine == "skypilot"
    name = f"boundary-{run_id}"
    home = tmp_path / "control-plane" / f"treb-{run_id}" / f"node-{node}"
    return {
        "RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": "2", "NODE_RANK": str(node), "GROUP_RANK": str(node),
        "MASTER_ADDR": "10.78.0.11" if sky else f"{name}-0.{name}", "MASTER_PORT": "29500",
        "TREB_RUN_ID": run_id, "TREB_ATTEMPT": "0",
        "SKYPILOT_NODE_RANK": str(node) if sky else None,
        "JOB_COMPLETION_INDEX": None if sky else str(node), "SECRET_SEEN": "s3cret",
        "host": f"ts{node + 1}" if sky else f"{name}-{node}",
        "cwd": str(home / "sky_workdir") if sky else "/treb-code",
    }  # fmt: skip


@pytest.mark.parametrize("engine", ["skypilot", "kubernetes"])
def test_two_nodes_of_gloo_ranks_with_the_contract(
    engine: str, treb: TrebFn, engine_env: dict[str, str], tmp_path: Path
) -> None:
    """Every rank sees the contract its engine's placement gives, all_reduce over gloo
    sums 1+2+3+4 across the hosts, the node agents' records say so on each node, and
    `treb logs --rank N` reads each rank's own output back from the engine's log API."""
    res = treb("run", str(job(tmp_path)), *ON[engine], env=engine_env, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED", st
    assert st["created_at"] <= st["started_at"] <= st["ended_at"], st  # how long it ran
    run_id = st["id"]
    for rank in range(4):
        node = rank // 2
        logs = treb("logs", run_id, "--rank", str(rank), env=engine_env)
        assert logs.returncode == 0, logs.stderr
        assert "all_reduce 10 of 4" in logs.stdout, logs.stdout
        assert contracts(logs.stdout) == [expected(engine, run_id, rank, tmp_path)]
        rec = record(node_run_dir(tmp_path, engine, run_id, node), rank)
        assert rec["exit_code"] == 0 and not rec["stopped_by_launcher"], rec
        assert rec["host"] == expected(engine, run_id, rank, tmp_path)["host"], rec


@pytest.mark.parametrize("engine", ["skypilot", "kubernetes"])
def test_first_failure_ends_the_other_node(
    engine: str, treb: TrebFn, engine_env: dict[str, str], tmp_path: Path
) -> None:
    """Rank 3 (node 1) raises after the all_reduce while the others wait: node 1's agent
    records it and stops rank 2; the engine then ends node 0 (SkyPilot: SIGTERM to its
    agent and ranks at once; Kubernetes: to the container's main process), whose ranks
    are recorded stopped, not failed. The run is FAILED, its diagnosis names rank 3's
    exception, and `treb logs` reads rank 3's traceback and node 1's account of it."""
    res = treb("run", str(job(tmp_path, fail="3")), *ON[engine], env=engine_env, timeout=120)
    assert res.returncode != 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"treb: run \w+ \(boundary\) FAILED after \d", res.stderr), res.stderr
    assert "cause: python_exception on rank 3 (node 1): ValueError: rank 3 fails on purpose" \
        in res.stderr, res.stderr  # fmt: skip
    st = status_json(treb)
    assert st["state"] == "FAILED", st
    run_id = st["id"]
    node1 = node_run_dir(tmp_path, engine, run_id, 1)
    failed, other = record(node1, 3), record(node1, 2)
    assert failed["exit_code"] not in (None, 0) and not failed["stopped_by_launcher"], failed
    assert other["stopped_by_launcher"], other
    node0 = node_run_dir(tmp_path, engine, run_id, 0)
    for rank in (0, 1):
        rec = record(node0, rank)
        assert rec["state"] == "ENDED" and rec["stopped_by_launcher"], rec
        assert rec["signal"] == "SIGTERM", rec
    events = read_events(Path(st["run_dir"]))  # the run directory on this machine
    [handed] = [e for e in events if e["event"] == engine]
    assert handed["backend_id"] == st["backend_id"], handed
    assert [e["event"] for e in events if e.get("state") == "FAILED"], events  # its end
    logs = treb("logs", run_id, "--rank", "3", env=engine_env)
    assert "ValueError: rank 3 fails on purpose" in logs.stdout, logs.stdout + logs.stderr
    agent = (Path(st["run_dir"]) / "attempt-0" / "agent-node-1.log").read_text()
    assert "treb: rank 3 (1:1) failed (exit code" in agent, agent


def test_skypilot_setup_runs_first_on_every_node(
    treb: TrebFn, engine_env: dict[str, str], tmp_path: Path
) -> None:
    """environment.setup renders a `setup:` section: SkyPilot runs it on every node before
    `run:`, in ~/sky_workdir, with SKYPILOT_NUM_NODES; the venv it builds on the node is
    where the ranks' python then comes from."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "setup.sh").write_text('echo "setup in $PWD of $SKYPILOT_NUM_NODES nodes"\n')
    spec = write_spec(work, """\
name: boundary
command: python -c 'import sys; print("prefix", sys.prefix)'
nodes: 2
procs_per_node: 1
environment: {setup: setup.sh, bare_nodes_only: true}
""")  # fmt: skip
    res = treb("run", str(spec), "--on", "skypilot", env=engine_env, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    for node in range(2):
        home = tmp_path / "control-plane" / f"treb-{st['id']}" / f"node-{node}"
        logs = treb("logs", st["id"], "--rank", str(node), env=engine_env)
        assert f"prefix {home}/.trebuchet/envs/boundary\n" in logs.stdout, logs.stdout
        agent = Path(st["run_dir"]) / "attempt-0" / f"agent-node-{node}.log"
        assert f"setup in {home}/sky_workdir of 2 nodes\n" in agent.read_text()
