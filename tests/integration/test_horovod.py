"""`launcher: horovod` with a real Horovod (0.28.1, built by scripts/horovod-wheel for
`make test`) on every engine that runs it: locally, over ssh on the two test hosts, on the
Slurm test cluster.

Each run trains scripts/horovod_train.py (hvd.DistributedOptimizer, broadcast, weights and
an allreduce checked equal on every rank, the rank contract checked against horovod's own
view); a failing rank must be named as the first failure, the others stopped, nothing left.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, needs, status_json, write_spec
from tests.integration.slurm_support import records, slurm_conf, status, streb  # noqa: F401
from tests.integration.test_ssh_runs import assert_nothing_left, ssh_config, wait_for  # noqa: F401
from trebuchet.runtime.process.procs import processes_of_run

pytestmark = [pytest.mark.integration]

TRAIN = REPO / "tests" / "integration" / "scripts" / "horovod_train.py"
PY = sys.executable  # the test venv: torch and horovod
BIN = str(Path(PY).parent)
# The ssh test hosts' host keys are throwaway (new at each start): OpenMPI's ssh, which
# knows no `ssh -F`, is told not to keep them (gloo's horovodrun ssh does not check them).
RSH = "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"


@pytest.fixture(autouse=True)
def _horovod() -> None:
    needs("horovod.torch")


def ok_lines(text: str) -> list[tuple[int, str, str, str]]:
    """Every rank's `HVD OK` line: (rank, host, controller, first weight)."""
    found = re.findall(r"HVD OK rank=(\d+) size=\d+ host=(\S+) controller=(\w+) w=(\S+)", text)
    return sorted((int(r), h, c, w) for r, h, c, w in found)


def check_trained(text: str, world: int, controller: str, hosts: list[str]) -> None:
    seen = ok_lines(text)
    assert [r for r, *_ in seen] == list(range(world)), text[-3000:]
    assert {c for _, _, c, _ in seen} == {controller}
    assert len({w for *_, w in seen}) == 1, seen  # the same weights on every rank
    assert [h for _, h, _, _ in seen] == hosts


def local_spec(tmp_path: Path, nodes: int, ppn: int, extra: str = "") -> Path:
    return write_spec(tmp_path, f"""\
name: hvd
command: {PY} {TRAIN}
launcher: horovod
nodes: {nodes}
procs_per_node: {ppn}
grace_period: 2
env: {{PATH: "{BIN}:${{PATH}}"{extra}}}
""")  # fmt: skip


@pytest.mark.parametrize(
    "controller,nodes,ppn", [("gloo", 1, 2), ("mpi", 1, 2), ("gloo", 2, 1), ("mpi", 2, 1)]
)
def test_local_trains(controller: str, nodes: int, ppn: int, treb: TrebFn, tmp_path: Path) -> None:
    """1 node x 2 and 2 simulated nodes x 1, under both horovod controllers."""
    spec = local_spec(tmp_path, nodes, ppn, f", HOROVOD_CONTROLLER: {controller}")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    logs = "".join(
        (Path(st["run_dir"]) / "attempt-0" / f"rank-{r}.log").read_text() for r in range(2)
    )
    check_trained(logs, 2, controller, [check_host()] * 2)
    recs = {p["label"]: p for p in st["procs"]}
    assert {recs[lbl]["node"] for lbl in recs if recs[lbl]["rank"] is not None} == set(range(nodes))


def left_or_exited(ff: dict, rank: int, code: int) -> bool:
    """The failing rank is the first failure: it exited with its code, or (a loaded
    machine) horovodrun stopped it in its slow exit once its peers failed on horovod's
    shutdown, and it is named as the rank that left first (rundir/records.left_first)."""
    return ff["rank"] == rank and (ff["exit_code"] == code or ff.get("left_first") is True)


def check_host() -> str:
    import socket

    return socket.gethostname()


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_local_failing_rank_is_named(controller: str, treb: TrebFn, tmp_path: Path) -> None:
    """Rank 1 exits 3 after a step: it is the first failure (not rank 0, whose horovod
    shut down after it, nor horovodrun's `one or more processes exited` summary), the others
    were stopped, nothing of the run is left. It prints horovod's shutdown text itself
    first (HVD_QUOTE_SHUTDOWN): its own words, no cascade (horovodrun.peer_shutdown)."""
    extra = f", HOROVOD_CONTROLLER: {controller}, HVD_FAIL_RANK: '1', HVD_QUOTE_SHUTDOWN: '1'"
    res = treb("run", str(local_spec(tmp_path, 1, 2, extra)))
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and left_or_exited(ff, 1, 3), ff
    assert "first failure: rank 1 (node 0, local rank 1) " in res.stderr
    assert "rank 1 failing on purpose" in res.stderr
    rank0 = next(p for p in st["procs"] if p["rank"] == 0)
    assert rank0["stopped_by_launcher"], st["procs"]
    assert not processes_of_run(st["id"])


def test_a_rank_stopped_in_its_own_exit_is_still_the_first_failure(
    treb: TrebFn, tmp_path: Path
) -> None:
    """Rank 1 leaves (sys.exit(3)) and its exit is slow: rank 0 fails on horovod's shutdown
    first, and horovodrun stops rank 1 (SIGTERM) before its exit ends, so no rank's record
    says a failure of its own (horovodrun itself names `Process 0`). Rank 0's log says
    another rank ended horovod; rank 1 is the only one it can be: named as the first
    failure (it left first), not horovodrun's exit 1 (seen under a loaded CI, without the
    slow exit, with a plain sys.exit)."""
    extra = ", HOROVOD_CONTROLLER: gloo, HVD_FAIL_RANK: '1', HVD_SLOW_EXIT: '20'"
    res = treb("run", str(local_spec(tmp_path, 1, 2, extra)))
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    ff = st["first_failure"]
    assert (ff["rank"], ff["signal"], ff.get("left_first")) == (1, "SIGTERM", True), ff
    assert "first failure: rank 1 (node 0, local rank 1) left first" in res.stderr, res.stderr
    assert "rank 1 failing on purpose" in res.stderr
    assert not processes_of_run(st["id"])


def test_bad_controller_is_refused(treb: TrebFn, tmp_path: Path) -> None:
    res = treb("run", str(local_spec(tmp_path, 1, 2, ", HOROVOD_CONTROLLER: nccl")))
    assert res.returncode == 2, res.stderr
    assert "job.yaml:7: env.HOROVOD_CONTROLLER: must be gloo or mpi, got 'nccl'" in res.stderr


# -- ssh: horovodrun on ts1 starts ts2's ranks through its own ssh ------------------------


def ssh_spec(tmp_path: Path, conf: str, ppn: int, env: str = "", copy: bool = True) -> Path:
    shared = f"shared_dir: none, remote_dir: {tmp_path / 'remote'}, " if copy else ""
    return write_spec(tmp_path / "job", f"""\
name: hvd-ssh
command: {PY} {TRAIN}
launcher: horovod
nodes: 2
procs_per_node: {ppn}
grace_period: 2
env: {{{env}}}
ssh: {{hosts: [ts1, ts2], config_file: {conf}, {shared}setup: [{json.dumps(f"export PATH={BIN}:$PATH")}]}}
""")  # fmt: skip


@pytest.mark.ssh
@pytest.mark.parametrize("controller,ppn,copy", [("gloo", 1, True), ("mpi", 2, False)])
def test_ssh_trains_on_both_hosts(
    controller: str, ppn: int, copy: bool, treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """The hosts' ssh port, identity and addresses go to horovodrun from the engine's ssh
    config; gloo: each rank's interface picked on its own host; mpi: node 0's subnet."""
    env = f"HOROVOD_CONTROLLER: {controller}"
    if controller == "mpi":
        env += f", OMPI_MCA_plm_rsh_agent: {json.dumps(RSH)}"
    res = treb("run", str(ssh_spec(tmp_path, ssh_config, ppn, env, copy)), "--on", "ssh")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    run_dir = Path(st["run_dir"])
    world = 2 * ppn
    logs = "".join((run_dir / "attempt-0" / f"rank-{r}.log").read_text() for r in range(world))
    check_trained(logs, world, controller, ["ts1"] * ppn + ["ts2"] * ppn)
    job = json.loads((run_dir / "job.json").read_text())
    assert job["horovod"]["hosts"] == ["10.78.0.11", "10.78.0.12"], job["horovod"]
    argv = json.loads((run_dir / "attempt-0" / "node-0.json").read_text())
    assert argv["host"] == "ts1" and argv["exit_code"] == 0
    assert_nothing_left(st["id"])


@pytest.mark.ssh
def test_ssh_failing_rank_on_the_second_host(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    env = "HOROVOD_CONTROLLER: gloo, HVD_FAIL_RANK: '3'"
    res = treb("run", str(ssh_spec(tmp_path, ssh_config, 2, env)), "--on", "ssh")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and ff["node"] == 1 and left_or_exited(ff, 3, 3), ff
    assert "first failure: rank 3 (node 1, local rank 1) on ts2 " in res.stderr
    assert "rank 3 failing on purpose on ts2" in res.stderr
    assert_nothing_left(st["id"])


@pytest.fixture
def ts2_names_it_ens5(ssh_config: str) -> Iterator[None]:  # noqa: F811
    """ts2's interface renamed eth0 -> ens5 for the test (its address and sshd stay), as
    hosts of two kinds name theirs; named back after. The hosts' lock is this session's."""

    def ip(*args: str) -> None:
        subprocess.run(["ip", "-n", "ts2", *args], check=True, capture_output=True, timeout=30)

    def rename(old: str, new: str) -> None:
        ip("link", "set", old, "down")
        ip("link", "set", old, "name", new)
        ip("link", "set", new, "up")

    rename("eth0", "ens5")
    try:
        yield
    finally:
        rename("ens5", "eth0")


@pytest.mark.ssh
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_ssh_hosts_naming_their_interfaces_differently(
    controller: str, treb: TrebFn, ssh_config: str, ts2_names_it_ens5: None, tmp_path: Path
) -> None:
    """horovodrun's own search finds no common interface here; treb gives it node 0's
    (gloo: eth0, and ts2's rank picks ens5 itself; mpi: the subnet, 10.78.0.0/24)."""
    env = f"HOROVOD_CONTROLLER: {controller}"
    if controller == "mpi":
        env += f", OMPI_MCA_plm_rsh_agent: {json.dumps(RSH)}"
    res = treb("run", str(ssh_spec(tmp_path, ssh_config, 1, env, copy=False)), "--on", "ssh")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    check_trained(res.stdout, 2, controller, ["ts1", "ts2"])
    if controller == "gloo":
        assert re.search(r"HVD OK rank=1 .* iface=ens5$", res.stdout, re.M), res.stdout
        assert re.search(r"HVD OK rank=0 .* iface=eth0$", res.stdout, re.M), res.stdout
    st = status_json(treb)
    node0 = (Path(st["run_dir"]) / "attempt-0" / "node-0.log").read_text()
    assert st["state"] == "SUCCEEDED", node0[-2000:]
    assert_nothing_left(st["id"])


USR2 = (
    "import os, signal, socket, time; "
    "signal.signal(signal.SIGUSR2, lambda *_: print('USR2 rank', os.environ['RANK'], "
    "socket.gethostname(), flush=True)); print('up', flush=True); time.sleep(120)"
)


@pytest.mark.ssh
def test_ssh_timeout_warning_reaches_both_hosts_ranks(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """The timeout's checkpoint signal reaches ts2's rank too (not a child of ts2's agent:
    horovod-wait passes it on), then the timeout stops both hosts' ranks."""
    spec = ssh_spec(tmp_path, ssh_config, 1, "HOROVOD_CONTROLLER: gloo", copy=False)
    command = json.dumps(f"{PY} -c {shlex.quote(USR2)}")
    text = spec.read_text().replace(f"command: {PY} {TRAIN}", f"command: {command}")
    spec.write_text(text + "timeout: 14s\ntimeout_warning: 7s\n")
    res = treb("run", str(spec), "--on", "ssh")
    assert res.returncode != 2, res.stderr
    st = status_json(treb)
    assert st["state"] == "TIMEOUT", res.stdout[-3000:] + res.stderr[-3000:]
    assert "USR2 rank 0 ts1" in res.stdout and "USR2 rank 1 ts2" in res.stdout, res.stdout
    assert_nothing_left(st["id"])


@pytest.mark.ssh
def test_ssh_cancel_leaves_nothing_on_either_host(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """Cancel while both hosts' ranks run: horovodrun on ts1 and the rank it started on ts2
    through its own ssh (not a child of ts2's agent) are all gone."""
    spec = ssh_spec(tmp_path, ssh_config, 1, "HOROVOD_CONTROLLER: gloo", copy=False)
    command = json.dumps(f"{PY} -c {shlex.quote(USR2)}")
    spec.write_text(spec.read_text().replace(f"command: {PY} {TRAIN}", f"command: {command}"))
    res = treb("run", str(spec), "--on", "ssh", "--detach")
    assert res.returncode == 0, res.stderr
    rid = status_json(treb)["id"]
    run_dir = Path(status_json(treb, rid)["run_dir"])
    wait_for(lambda: all(
        (run_dir / "attempt-0" / f"rank-{r}.log").is_file()
        and "up" in (run_dir / "attempt-0" / f"rank-{r}.log").read_text() for r in (0, 1)
    ), 90, "both ranks up")  # fmt: skip
    res = treb("cancel", rid)
    assert res.returncode == 0, res.stderr
    assert status_json(treb, rid)["state"] == "CANCELLED"
    assert_nothing_left(rid)


# -- Slurm: horovod under mpirun (OpenMPI's daemons started by srun) ----------------------


@pytest.mark.slurm
def test_slurm_trains_on_two_nodes(streb, tmp_path: Path) -> None:  # noqa: F811
    spec = local_spec(tmp_path, 2, 1)
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert st["state"] == "SUCCEEDED"
    check_trained(res.stdout, 2, "mpi", ["tn1", "tn2"])
    recs = records(st["run_dir"])
    assert [recs[f"rank-{r}"]["host"] for r in range(2)] == ["tn1", "tn2"]
    assert recs["node-0"]["host"] == "tn1" and "node-1" not in recs  # one mpirun


@pytest.mark.slurm
def test_slurm_failing_rank_is_named(streb, tmp_path: Path) -> None:  # noqa: F811
    spec = local_spec(tmp_path, 2, 1, ", HVD_FAIL_RANK: '1'")
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and (ff["rank"], ff["node"], ff["host"]) == (1, 1, "tn2")
    assert records(st["run_dir"])["rank-0"]["stopped_by_launcher"]


def test_determined_experiment_imported_and_run(treb: TrebFn, tmp_path: Path) -> None:
    """Seed 002's launch part: `treb import determined` carries the horovod launch layer,
    the slots, max_restarts and the fusion optimizations; the spec it writes trains."""
    src = tmp_path / "experiment.yaml"
    src.write_text(f"""\
name: mnist-horovod
entrypoint: python3 -m determined.launch.horovod --autohorovod -- {PY} {TRAIN}
resources:
  slots_per_trial: 2
max_restarts: 1
optimizations:
  tensor_fusion_threshold: 64
  tensor_fusion_cycle_time: 5
  aggregation_frequency: 1
environment:
  environment_variables: ["PATH={BIN}:/usr/local/bin:/usr/bin:/bin"]
searcher: {{name: single, metric: loss}}
""")  # fmt: skip
    res = treb("import", "determined", str(src))
    assert res.returncode == 0, res.stderr
    assert "experiment.yaml:9: not carried over: optimizations.aggregation_frequency" in res.stderr
    assert "experiment.yaml:12: not carried over: searcher" in res.stderr
    spec = tmp_path / "job.yaml"
    spec.write_text(res.stdout)
    run = treb("run", str(spec))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED" and st["name"] == "mnist-horovod"
    logs = "".join(
        (Path(st["run_dir"]) / "attempt-0" / f"rank-{r}.log").read_text() for r in range(2)
    )
    check_trained(logs, 2, "gloo", [check_host()] * 2)


def test_check_build_preflight(treb: TrebFn, tmp_path: Path) -> None:
    """`horovodrun --check-build` of the real install: PyTorch, MPI and Gloo built, so
    `treb check` finds nothing for either controller; its answer is cached per install."""
    from trebuchet.preflight.horovod import built, cache_dir

    for controller in ("gloo", "mpi"):
        spec = local_spec(tmp_path / controller, 1, 2, f", HOROVOD_CONTROLLER: {controller}")
        res = treb("check", str(spec))
        assert res.returncode == 0 and "horovod-build" not in res.stdout, res.stdout
    cached = max(cache_dir().glob("horovod-check-build-*.txt"), key=lambda p: p.stat().st_mtime)
    text = cached.read_text()
    assert {"PyTorch", "MPI", "Gloo"} <= built(text)
    assert "PyTorch" not in built(text.replace("[X] PyTorch", "[ ] PyTorch"))
