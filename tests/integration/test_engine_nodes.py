"""SkyPilot's `run:` and the Kubernetes pod command, run here for 2 nodes x 2 ranks: the node
agent (the runtime's `node` verb) starts each node's ranks with the contract, records
them, stops the others on the first failure and enforces the timeout.

No SkyPilot or Kubernetes runs on this machine: tests/engine_nodes.py stands in for what
the engine does on a node (its variables, the shipped files where file_mounts or the
ConfigMap put them), with real processes. examples/hello is the command: a stdlib TCP
exchange between all ranks through MASTER_ADDR:MASTER_PORT, with the contract checked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_program
from tests.engine_nodes import (
    BIN,
    finish,
    k8s_docs,
    k8s_pod,
    load,
    sky_node,
    sky_task,
    spec_file,
    started,
)
from trebuchet.launcher.plan import free_port

pytestmark = pytest.mark.integration

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello" / "job.yaml"
FAIL_RANK_3 = 'if [ "$RANK" = 3 ]; then echo bad >&2; exit 7; fi; echo waiting; exec sleep 600'
TRAPS = (
    "trap 'echo checkpoint $RANK' USR2; trap 'echo stopping $RANK; exit 0' TERM; "
    "echo started; while :; do sleep 0.1; done"
)


def record(run_dir: Path, rank: int, attempt: int = 0) -> dict:
    return json.loads((run_dir / f"attempt-{attempt}" / f"rank-{rank}.json").read_text())


def hello(*overrides: str):
    return load(HELLO, f"master_port={free_port()}", *overrides)


def test_skypilot_two_nodes_say_hello(tmp_path: Path) -> None:
    task = sky_task(hello(), tmp_path / "run")
    homes = [tmp_path / f"node{i}" for i in range(2)]
    with started(*(sky_node(task, homes[i], i, 2) for i in range(2))) as procs:
        results = [finish(p) for p in procs]
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, (i, out, err)
        run_dir = homes[i] / ".trebuchet" / "runs" / "r1"
        for local in range(2):
            rank = 2 * i + local
            assert f"[{i}:{local}] rank {rank} ok\n" in out
            rec = record(run_dir, rank)
            assert rec["state"] == "ENDED" and rec["exit_code"] == 0, rec
            assert (rec["node"], rec["local_rank"], rec["attempt"]) == (i, local, 0)
            assert not rec["stopped_by_launcher"]
    assert "[0:0] all 4 ranks said hello\n" in results[0][1]


def test_skypilot_failing_rank_stops_its_node(tmp_path: Path) -> None:
    path = spec_file(tmp_path / "work", f"command: {json.dumps(FAIL_RANK_3)}\nnodes: 2\n"
                     "procs_per_node: 2\ngrace_period: 2s\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    home = tmp_path / "node1"
    with started(sky_node(task, home, 1, 2)) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 7, (out, err)
    run_dir = home / ".trebuchet" / "runs" / "r1"
    failed, other = record(run_dir, 3), record(run_dir, 2)
    assert failed["exit_code"] == 7 and not failed["stopped_by_launcher"]
    assert other["stopped_by_launcher"] and other["signal"] == "SIGTERM"
    assert "[1:1] bad\n" in out and "[1:0] waiting\n" in out
    assert "treb: rank 3 (1:1) failed (exit code 7): stopping the others" in out


def test_kubernetes_two_pods_say_hello(tmp_path: Path) -> None:
    """The image's working directory is empty: hello.py comes in the ConfigMap's code
    archive, which each pod unpacks into its /treb-code."""
    docs = k8s_docs(hello("kubernetes.image=python:3.12-slim"))
    roots = [tmp_path / f"pod{i}" for i in range(2)]
    empty = tmp_path / "image-workdir"
    empty.mkdir()
    with started(*(k8s_pod(docs, roots[i], i, empty) for i in range(2))) as procs:
        results = [finish(p) for p in procs]
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, (i, out, err)
        for local in range(2):
            rank = 2 * i + local
            assert f"[{i}:{local}] rank {rank} ok\n" in out
            rec = record(roots[i] / "treb-run", rank)  # no annotation: attempt 0
            assert rec["exit_code"] == 0 and rec["attempt"] == 0, rec
    assert "[0:0] all 4 ranks said hello\n" in results[0][1]


def test_kubernetes_pod_builds_the_environment_in_the_unpacked_code(tmp_path: Path) -> None:
    """environment.setup (no requirements: no network here): the pod unpacks the code,
    builds a venv, runs setup.sh inside it, and the ranks run with that venv's python."""
    work = tmp_path / "work"
    path = spec_file(work, "command: python -c 'import sys; print(\"prefix\", sys.prefix)'\n"
                     "procs_per_node: 1\nenvironment: {setup: setup.sh, bare_nodes_only: true}\n"
                     "kubernetes: {image: i}\n")  # fmt: skip
    (work / "setup.sh").write_text('touch "$VIRTUAL_ENV.built" 2>/dev/null; touch built-here\n')
    docs = k8s_docs(load(path))
    root = tmp_path / "pod0"
    empty = tmp_path / "image-workdir"
    empty.mkdir()
    with started(k8s_pod(docs, root, 0, empty)) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 0, (out, err)
    env = root / ".trebuchet" / "envs" / "job"
    assert f"[0:0] prefix {env}\n" in out
    assert (root / "treb-code" / "built-here").exists()  # setup ran in the unpacked code


def test_kubernetes_failing_rank_in_a_retried_pod(tmp_path: Path) -> None:
    """The pod's index has failed once: the downward API gives 1, the records are attempt 1."""
    path = spec_file(tmp_path / "work", f"command: {json.dumps(FAIL_RANK_3)}\nnodes: 2\n"
                     "procs_per_node: 2\nretries: 2\nkubernetes: {image: i}\n")  # fmt: skip
    docs = k8s_docs(load(path))
    root = tmp_path / "pod1"
    with started(k8s_pod(docs, root, 1, tmp_path, failure_count="1")) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 7, (out, err)
    run_dir = root / "treb-run"
    assert record(run_dir, 3, attempt=1)["exit_code"] == 7
    assert record(run_dir, 2, attempt=1)["stopped_by_launcher"]


def test_timeout_sends_the_checkpoint_signal_then_stops_the_node(tmp_path: Path) -> None:
    """timeout 6s, warning 4s: each rank gets SIGUSR2 (it traps it), then SIGTERM; the node
    exits 124, as the coreutils `timeout` it replaces did."""
    path = spec_file(tmp_path / "work", f"command: {json.dumps(TRAPS)}\nprocs_per_node: 2\n"
                     "timeout: 6s\ntimeout_warning: 4s\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    home = tmp_path / "node0"
    with started(sky_node(task, home, 0, 1, ips="127.0.0.1")) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 124, (out, err)
    for local in range(2):
        lines = [line for line in out.splitlines() if line.startswith(f"[0:{local}] ")]
        words = [line.split()[1] for line in lines]
        assert [w for w in words if w != "Terminated"] == ["started", "checkpoint", "stopping"]
        rec = record(home / ".trebuchet" / "runs" / "r1", local)
        assert rec["stopped_by_launcher"] and rec["exit_code"] == 0, rec
    assert "treb: node 0: timeout in " in out and "treb: node 0: timeout (6s)" in out


def test_rank_without_a_handler_is_not_sent_the_checkpoint_signal(tmp_path) -> None:
    """A rank that does not handle the warning's SIGUSR2 is not sent it (it would die of it):
    the node says so, the ranks run on to the timeout and are stopped by it (exit 124)."""
    path = spec_file(tmp_path / "work", "command: exec sleep 600\nprocs_per_node: 2\n"
                     "timeout: 5s\ntimeout_warning: 4s\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    home = tmp_path / "node0"
    with started(sky_node(task, home, 0, 1, ips="127.0.0.1")) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 124, (out, err)
    assert "no rank handles SIGUSR2, so none was sent" in out
    for local in range(2):
        rec = record(home / ".trebuchet" / "runs" / "r1", local)
        assert rec["stopped_by_launcher"] and rec["signal"] == "SIGTERM", rec


def python38() -> str | None:
    """A python3.8 that works (pyenv's shim may exist without the version selected)."""
    candidates = [shutil.which("python3.8"), "/root/.pyenv/versions/3.8.18/bin/python3.8"]
    for exe in filter(None, candidates):
        try:
            res = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)  # fmt: skip
        except OSError:
            continue
        if res.returncode == 0 and res.stdout.strip() == "(3, 8)":
            return exe
    return None


def test_node_agent_runs_on_python_3_8(tmp_path: Path) -> None:
    """The pod's python3 is 3.8 (the oldest the runtime supports); the ranks' `python` is
    this interpreter."""
    exe = python38()
    if exe is None:
        pytest.skip("no python3.8 on this machine")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(exe)
    docs = k8s_docs(hello("kubernetes.image=python:3.8-slim", "nodes=1"))
    path = f"{bin_dir}{os.pathsep}{BIN}{os.pathsep}/usr/bin:/bin"
    with started(k8s_pod(docs, tmp_path / "pod0", 0, HELLO.parent, path=path)) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 0, (out, err)
    assert "[0:1] rank 1 ok\n" in out and "[0:0] all 2 ranks said hello\n" in out


@pytest.mark.parametrize("launcher", ["torchrun", "none"])
def test_skypilot_other_launchers_say_hello(launcher, tmp_path: Path) -> None:
    """torchrun: each worker runs the runtime's `worker` (its own log and record), whose
    lines the node copies too; none: the command once per node."""
    if launcher == "torchrun":
        needs_program("torchrun")
    task = sky_task(hello(f"launcher={launcher}"), tmp_path / "run")
    homes = [tmp_path / f"node{i}" for i in range(2)]
    with started(*(sky_node(task, homes[i], i, 2) for i in range(2))) as procs:
        results = [finish(p) for p in procs]
    for i, (rc, out, err) in enumerate(results):
        assert rc == 0, (i, out, err)
        run_dir = homes[i] / ".trebuchet" / "runs" / "r1" / "attempt-0"
        node = json.loads((run_dir / f"node-{i}.json").read_text())
        assert node["exit_code"] == 0 and node["node"] == i
        if launcher == "torchrun":
            for local in range(2):
                rank = 2 * i + local
                assert f"[{i}:{local}] rank {rank} ok\n" in out
                assert record(run_dir.parent, rank)["exit_code"] == 0
        else:
            assert f"[{i}] rank {i} ok\n" in out
    world = 4 if launcher == "torchrun" else 2
    assert f"all {world} ranks said hello\n" in results[0][1]


def test_torchrun_workers_get_the_checkpoint_signal(tmp_path: Path) -> None:
    """torchrun ignores SIGUSR1/2 (it would die of them): the timeout warning goes to its
    workers, whose agents hand it to the command."""
    needs_program("torchrun")
    path = spec_file(tmp_path / "work", f"command: {json.dumps(TRAPS)}\nprocs_per_node: 2\n"
                     "launcher: torchrun\ntimeout: 12s\ntimeout_warning: 8s\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    with started(sky_node(task, tmp_path / "node0", 0, 1, ips="127.0.0.1")) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 124, (out, err)
    for local in range(2):
        assert f"[0:{local}] checkpoint {local}\n" in out, out


def test_node_verb_stops_its_hung_ranks(tmp_path: Path) -> None:
    """hang_timeout on an engine whose run directory is the node's own: the node agent
    decides for its ranks (none progressed), dumps their stacks and exits 1."""
    hung = f"{BIN}/python -c \"import time; print('ready', flush=True); time.sleep(600)\""
    path = spec_file(tmp_path / "work", f"command: {json.dumps(hung)}\nprocs_per_node: 2\n"
                     "hang_timeout: 5s\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    home = tmp_path / "node0"
    with started(sky_node(task, home, 0, 1, ips="127.0.0.1")) as (proc,):
        rc, out, err = finish(proc)
    assert rc == 1, (out, err)
    assert "treb: node 0: hang: no rank made progress" in out, out
    adir = home / ".trebuchet" / "runs" / "r1" / "attempt-0"
    assert sorted(p.name for p in (adir / "stacks").glob("rank-*.txt")) == [
        "rank-0.txt", "rank-1.txt"]  # fmt: skip
    assert json.loads((adir / "hang.json").read_text())["action"] == "fail"
    for local in range(2):
        assert record(home / ".trebuchet" / "runs" / "r1", local)["stopped_by_launcher"]
