"""A node lost while its ranks run, on the real test cluster (issue 23, its first part:
the loss noticed in seconds and named). Every process in the second node's network
namespace is killed after its link is taken down, as when a machine dies: no FIN, no
error from srun. Before the agents' heartbeat (runtime/job/link.py) the run stayed
RUNNING without a word until Slurm gave up on the node (SlurmdTimeout, 300 s by default).

Without a spare or a node range a lost node ends the run FAILED with its cause, retries or
not; with `spare_nodes` the next attempt runs on the survivors and a spare, and with
`nodes: MIN:MAX` on fewer nodes, resuming from the checkpoint (runtime/job/nodeset.py).
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.dead_machine import kill_namespace
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    CLUSTER,
    big_partition,
    records,
    release_requeued,
    slurm_conf,
    status,
    streb,
    wait_for,
    wait_ranks_running,
)
from trebuchet.runtime.contracts.rank_env import expand_hostlist

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

LOOP = "python3 -c 'import time\nfor i in range(600): print(i, flush=True); time.sleep(1)'"


def kill_node(name: str) -> None:
    kill_namespace(name, f"treb-{name}")


@pytest.fixture
def lost_nodes(slurm_conf: str) -> Iterator[list[str]]:
    """The nodes a test kills (it adds their names), brought back afterwards (`cluster.sh up`
    rebuilds what is not healthy), so that the tests after it find the cluster as before."""
    names: list[str] = []
    yield names
    if not names:
        return
    for name in names:
        subprocess.run(["ip", "link", "set", f"treb-{name}", "up"], timeout=30)
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    res = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    for name in names:  # the node slurmctld marked DOWN: back in service
        subprocess.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"],
                       capture_output=True, env=env, timeout=60)  # fmt: skip


@pytest.fixture
def node_to_lose(lost_nodes: list[str]) -> str:
    lost_nodes.append("tn2")
    return "tn2"


# A training loop that checkpoints every step (rank 0, into TREB_CHECKPOINT_DIR) and resumes
# from it: each step an allreduce over gloo, so every rank of the world takes part.
TRAIN = """\
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = os.path.join(os.environ["TREB_CHECKPOINT_DIR"], "step")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
print(f"start {start} world {world} node {os.environ['NODE_RANK']} "
      f"master {os.environ['MASTER_ADDR']}", flush=True)
print("slurm " + " ".join(f"{k}={os.environ.get(k, '-')}" for k in (
    "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NODELIST",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES")), flush=True)
for step in range(start, 40):
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world
    if rank == 0:
        os.makedirs(os.path.dirname(ckpt), exist_ok=True)
        open(ckpt + ".tmp", "w").write(str(step + 1))
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.4)
print(f"done world {world}", flush=True)
dist.destroy_process_group()
"""


def attempt_nodes(run_dir: str, attempt: int) -> list[str]:
    """The attempt's nodes, from its attempt.json (the job may run before it is written)."""
    path = Path(run_dir) / f"attempt-{attempt}" / "attempt.json"
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.2)
    return str(json.loads(path.read_text())["nodes"]).split(",")


def lose_a_node_while_training(streb, tmp_path: Path, lost_nodes: list[str], extra: str,
                               victim: int) -> tuple[dict, list[str], float]:  # fmt: skip
    """Run TRAIN on the `big` partition, kill the attempt's node `victim` (its index in the
    attempt, 0 being the batch host) once it trained a few steps; the run's end state."""
    (tmp_path / "train.py").write_text(TRAIN)
    spec = write_spec(tmp_path, "name: survives\ncommand: python3 train.py\nretries: 1\n"
                      f"node_timeout: 5s\nslurm:\n  partition: big\n{extra}")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=120)
    run_dir = st["run_dir"]
    first = attempt_nodes(run_dir, 0)
    wait_ranks_running(run_dir, len(first))
    ckpt = Path(run_dir) / "checkpoints" / "step"
    deadline = time.monotonic() + 120
    while not (ckpt.exists() and int(ckpt.read_text() or 0) >= 5):
        assert time.monotonic() < deadline, "the training made no step"
        time.sleep(0.3)
    lost_nodes.append(first[victim])
    killed_at = time.time()
    kill_node(first[victim])
    st = wait_for(streb, rid, {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}, 240)
    print((Path(run_dir) / "batch.log").read_text())
    return st, first, killed_at


def rank_logs(run_dir: str, attempt: int) -> str:
    return "".join(p.read_text() for p in sorted((Path(run_dir) / f"attempt-{attempt}").glob(
        "rank-*.log")))  # fmt: skip


def test_a_spare_node_replaces_a_lost_one_and_the_run_resumes(
    streb, big_partition: str, lost_nodes: list[str], tmp_path: Path
) -> None:
    st, first, killed_at = lose_a_node_while_training(
        streb, tmp_path, lost_nodes, "nodes: 2\nspare_nodes: 1\n", victim=1
    )
    run_dir = st["run_dir"]
    assert st["state"] == "SUCCEEDED", st
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"], st["attempts"]
    second = attempt_nodes(run_dir, 1)
    assert len(first) == 2 and len(second) == 2 and first[1] not in second, (first, second)
    assert second[0] == first[0]  # the master stayed: node 0 was not lost
    hosts = {r.get("host") for r in records(run_dir, 1).values()}
    assert hosts == set(second), hosts
    logs = rank_logs(run_dir, 1)
    resumed = [int(line.split()[1]) for line in logs.splitlines() if line.startswith("start ")]
    assert resumed and min(resumed) >= 5, logs  # from the checkpoint, not from 0
    assert "done world 2" in logs, logs
    shown = streb("status", run_dir.rsplit("/", 1)[-1])
    assert f"node_lost: {first[1]}" in shown.stdout, shown.stdout
    started = max(r.get("started_at") or 0 for r in records(run_dir, 1).values())
    print(f"node killed -> every rank of the next attempt started: {started - killed_at:.1f}s")
    # Issue 36: the survivor's agent ran the retry parked in its step (srun --no-kill), the
    # spare's in a new step on the spare alone, each rank with the attempt's contract
    ranks = {r["rank"]: r for r in records(run_dir, 1).values() if r.get("rank") is not None}
    assert sorted(ranks) == [0, 1], ranks  # every rank once
    before = {
        r["host"]: r["step_id"] for r in records(run_dir, 0).values() if r.get("rank") is not None
    }
    assert ranks[0]["host"] == first[0] and ranks[0]["step_id"] == before[first[0]], ranks
    assert ranks[1]["host"] == second[1] and ranks[1]["step_id"] != before[first[0]], ranks
    jobs = set()
    for rank in ranks:  # what each rank said of its own environment
        said = (Path(run_dir) / "attempt-1" / f"rank-{rank}.log").read_text()
        assert f"world 2 node {rank} master {second[0]}" in said, said
        # Slurm's variables agree with the attempt's placement on the parked survivor as on
        # the spare (before, the survivor kept its old step's node lists, the lost node in)
        line = next(ln for ln in said.splitlines() if ln.startswith("slurm "))
        env = dict(word.split("=", 1) for word in line.split()[1:])
        assert (env["SLURM_NODEID"], env["SLURM_NNODES"]) == (str(rank), "2"), line
        assert env["SLURM_STEP_NUM_NODES"] == "2", line
        assert expand_hostlist(env["SLURM_STEP_NODELIST"]) == second, line
        assert env["SLURM_NODELIST"] == env["SLURM_JOB_NODELIST"], line  # Slurm's alias
        assert set(second) <= set(expand_hostlist(env["SLURM_JOB_NODELIST"])), line
        jobs.add((env["SLURM_JOB_NODELIST"], env["SLURM_JOB_NUM_NODES"]))
    assert len(jobs) == 1, jobs  # the job's nodes, as every rank sees them
    batch = (Path(run_dir) / "batch.log").read_text()
    assert f"a new step on {second[1]}" in batch and "kept for the other nodes'" in batch, batch
    job_id = st["backend_id"]
    deadline = time.monotonic() + 60
    while slurm_state(job_id):  # the job ended: none of its steps is left, the lost one's too
        assert time.monotonic() < deadline, slurm_state(job_id)
        time.sleep(0.5)
    assert not job_sruns(job_id), "an srun of the job outlived it"


def test_a_node_range_goes_on_with_fewer_nodes(
    streb, big_partition: str, lost_nodes: list[str], tmp_path: Path
) -> None:
    st, first, _ = lose_a_node_while_training(
        streb, tmp_path, lost_nodes, "nodes: '2:3'\n", victim=2
    )
    run_dir = st["run_dir"]
    assert st["state"] == "SUCCEEDED", st
    second = attempt_nodes(run_dir, 1)
    assert len(first) == 3 and second == [h for h in first if h != first[2]], (first, second)
    logs = rank_logs(run_dir, 1)
    assert "done world 2" in logs and "world 3" not in logs, logs
    assert "done world 3" not in rank_logs(run_dir, 0)


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


def test_the_batch_hosts_loss_requeues_the_job_and_the_run_goes_on(
    streb, big_partition: str, lost_nodes: list[str], tmp_path: Path
) -> None:
    """Node 0 runs the job controller: when it dies, nothing of the job there can notice,
    and with --no-kill Slurm keeps the job RUNNING without its batch script. The agents on
    the other node notice that the controller stopped answering (runtime/job/batchloss.py), say
    so and requeue the job; its restart runs the next attempt, on nodes Slurm still has,
    from the checkpoint."""
    (tmp_path / "train.py").write_text(TRAIN)
    spec = write_spec(tmp_path, "name: loses-node-0\ncommand: python3 train.py\nretries: 1\n"
                      "nodes: 2\nspare_nodes: 1\nnode_timeout: 5s\nslurm:\n  partition: big\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=120)
    run_dir, job_id = st["run_dir"], st["backend_id"]
    first = attempt_nodes(run_dir, 0)
    wait_ranks_running(run_dir, 2)
    ckpt = Path(run_dir) / "checkpoints" / "step"
    deadline = time.monotonic() + 120
    while not (ckpt.exists() and int(ckpt.read_text() or 0) >= 3):
        assert time.monotonic() < deadline, "the training made no step"
        time.sleep(0.3)
    lost_nodes.append(first[0])
    kill_node(first[0])
    deadline = time.monotonic() + 180
    while "PENDING" not in slurm_state(job_id):
        assert time.monotonic() < deadline, f"job {job_id} not requeued: {slurm_state(job_id)}"
        time.sleep(1)
    release_requeued(job_id)
    st = wait_for(streb, rid, {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}, 240)
    print((Path(run_dir) / "batch.log").read_text())
    assert st["state"] == "SUCCEEDED", st
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"], st["attempts"]
    why = st["attempts"][0]["reason"]  # said by the agents that noticed (batchloss.py)
    assert why.startswith(f"node_lost: {first[0]} (the job controller's node"), why
    assert "the job is requeued" in why, why
    second = attempt_nodes(run_dir, 1)
    assert first[0] not in second and len(second) == 2, (first, second)
    logs = rank_logs(run_dir, 1)
    resumed = [int(line.split()[1]) for line in logs.splitlines() if line.startswith("start ")]
    assert resumed and min(resumed) >= 3 and "done world 2" in logs, logs


def slurm_state(job_id: str) -> str:
    res = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return res.stdout.strip()


def job_sruns(job_id: str) -> list[int]:
    """The srun processes of the job still on this machine (their environment names it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if name == "srun" and f"SLURM_JOB_ID={job_id}".encode() in env:
            found.append(int(pid))
    return found
