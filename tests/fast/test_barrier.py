"""Every node's checks before any rank (runtime/barrier.py), in its parts, without a
cluster: the Slurm controller's go over real sockets (given once every task of the step
said its node is healthy, never before), the step's health records as the fallback (a
record of another step counts for nothing), and the environment an ssh session's setup
made handed to the agent past a pyenv-style shim (real bash, a real pipe). The whole
path on the hosts and the cluster: tests/integration/test_never_in_the_way.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from trebuchet.runtime.job import link as agent_link
from trebuchet.runtime.node import barrier
from trebuchet.runtime.node.per_node import SETUP_ENV_FD, SETUP_ENV_VAR
from trebuchet.runtime.rundir.records import write_json

REPO = Path(__file__).resolve().parents[2]


def wait_go(link: agent_link.Link, limit: float = 5.0) -> bool | None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if link.wait_go(0.05):
            return True
    return None


def test_the_go_comes_once_every_task_said_healthy(monkeypatch) -> None:
    r, w = os.pipe()
    hub = agent_link.Hub(w)
    try:
        monkeypatch.setenv(agent_link.ENV, hub.address("127.0.0.1"))
        hub.expect(attempt=0, tasks=3)
        links = [agent_link.open_link(0, str(t), f"n{t}") for t in range(3)]
        assert all(link is not None for link in links)
        assert links[0].healthy() and links[1].healthy()  # type: ignore[union-attr]
        assert links[0].wait_go(0.5) is None  # type: ignore[union-attr]  # task 2 still checks
        assert links[1].wait_go(0.1) is None  # type: ignore[union-attr]
        assert links[2].healthy()  # type: ignore[union-attr]
        assert all(wait_go(link) for link in links)  # type: ignore[arg-type]
    finally:
        hub.close()
        os.close(r)
        os.close(w)


def records(adir: Path, step: str, healthy: list[bool], attempt: int = 0) -> None:
    for node, ok in enumerate(healthy):
        write_json(str(adir / f"health-{node}.json"),
                   {"node": node, "attempt": attempt, "healthy": ok, "step": step})  # fmt: skip


def test_the_step_records_decide_without_a_link(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    never = lambda wait: None  # noqa: E731 - no link
    records(tmp_path, "7.1", [True, True])
    assert barrier.slurm_wait(never, str(tmp_path), 0, 2, lambda: False) is True
    records(tmp_path, "7.1", [True, False])
    assert barrier.slurm_wait(never, str(tmp_path), 0, 2, lambda: False) is False
    # another step's (a requeued job's earlier try) or attempt's records: not a verdict
    records(tmp_path, "7.0", [True, True])
    stops = iter([False] * 8 + [True])
    assert barrier.slurm_wait(never, str(tmp_path), 0, 2, lambda: next(stops)) is False
    records(tmp_path, "7.1", [True, True], attempt=1)
    stops = iter([False] * 8 + [True])
    assert barrier.slurm_wait(never, str(tmp_path), 0, 2, lambda: next(stops)) is False
    # the teardown marker (an unhealthy node's task stopped the step) stops the wait
    (tmp_path / "teardown").write_text("node_unhealthy\n")
    assert barrier.slurm_wait(never, str(tmp_path), 1, 2, lambda: False) is False
    assert barrier.slurm_wait(never, str(tmp_path), 1, 1, lambda: False) is True  # one node


def test_the_agent_takes_back_what_setup_made_past_a_shim(tmp_path: Path) -> None:
    """bash hands `env -0` on a pipe, then execs through a shim that prepends to PATH and
    sets PYENV_VERSION: the agent's environment is setup's again, values with newlines
    and '=' included; without the pipe's contents it is left as it is."""
    shim = tmp_path / "python3"
    shim.write_text(f'#!/bin/bash\nexport PATH="/shim/bin:$PATH" PYENV_VERSION=3.9\n'
                    f'exec {sys.executable} "$@"\n')  # fmt: skip
    shim.chmod(0o755)
    probe = ("import json, os; from trebuchet.runtime.node.per_node import setup_environ; "
             "done = setup_environ(); print(json.dumps([done, dict(os.environ)]))")  # fmt: skip
    script = (f'export PATH="/venv/bin:$PATH" ODD="a=b\nc" {SETUP_ENV_VAR}={SETUP_ENV_FD}; '
              f'exec {shim} -c "$1" {SETUP_ENV_FD}< <(env -0)')  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(["bash", "-c", script, "x", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout  # fmt: skip
    done, got = json.loads(out)
    assert done is True
    assert got["PATH"].startswith("/venv/bin:") and "/shim/bin" not in got["PATH"]
    assert "PYENV_VERSION" not in got and SETUP_ENV_VAR not in got
    assert got["ODD"] == "a=b\nc"
    empty = script.replace("<(env -0)", "/dev/null")
    out = subprocess.run(["bash", "-c", empty, "x", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout  # fmt: skip
    done, got = json.loads(out)
    assert done is False and got["PATH"].startswith("/shim/bin:")


def test_a_nodes_other_tasks_wait_for_this_steps_verdict(tmp_path: Path, monkeypatch) -> None:
    """A node's tasks after its first (one Slurm task per rank) take the first task's
    health verdict from health-<node>.json: only this step's, never one an earlier try of
    the attempt left there (here unhealthy: it would have kept a healthy node's ranks
    from starting). This step's record comes a moment later and decides."""
    import threading

    from trebuchet.runtime.node import health

    adir = tmp_path / "attempt-0"
    adir.mkdir()
    records(adir, "7.1", [False])  # an earlier try's: the node was unhealthy then
    for name, value in {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_NNODES": "1",
        "TREB_ATTEMPT": "0",
    }.items():
        monkeypatch.setenv(name, value)  # fmt: skip
    later = threading.Timer(0.3, records, (adir, "7.2", [True]))
    later.start()
    try:
        job = {"run_dir": str(tmp_path), "workdir": str(tmp_path), "ppn": 2}
        assert health.slurm_gate(job) is None  # healthy: this step's verdict
    finally:
        later.join()


def test_an_agent_with_its_link_reads_no_record_until_the_link_ends(
    tmp_path: Path, monkeypatch
) -> None:
    """64 agents each reading every node's record every FILES_S while they waited was
    O(nodes^2) reads of the shared filesystem: an agent whose link holds waits for the
    controller's go alone (the teardown marker aside); once its link ended, the records."""
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    monkeypatch.setattr(barrier, "FILES_S", 0.01)
    never = lambda wait: None  # noqa: E731 - the link's go has not come
    records(tmp_path, "7.1", [True, True])
    reads: list[str] = []
    real = barrier.read_json
    monkeypatch.setattr(barrier, "read_json", lambda path: reads.append(path) or real(path))
    stops = iter([False] * 20 + [True])
    assert (
        barrier.slurm_wait(never, str(tmp_path), 0, 2, lambda: next(stops), lambda: False) is False
    )
    assert reads == []
    linked = iter([True] * 5 + [False] * 100)  # its link ends after a few polls
    verdict = barrier.slurm_wait(
        never, str(tmp_path), 0, 2, lambda: False, lambda: not next(linked)
    )
    assert verdict is True and len(reads) == 2


def test_the_controller_gives_the_go_for_a_task_without_a_link(tmp_path: Path, monkeypatch) -> None:
    """Task 2's agent could not connect: it says its node is healthy in its record only.
    The controller (one reader) reads the attempt's records and gives the go to the tasks
    that said `health` on the link; one that says it later gets it at once. A record of
    another step or an unhealthy node is no go."""
    from types import SimpleNamespace

    from trebuchet.runtime.slurm.step import Controller

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    r, w = os.pipe()
    hub = agent_link.Hub(w)
    try:
        monkeypatch.setenv(agent_link.ENV, hub.address("127.0.0.1"))
        hub.expect(attempt=0, tasks=4)
        links = [agent_link.open_link(0, f"1.{t}", f"n{t}") for t in range(3)]
        assert all(link is not None for link in links)
        assert links[0].healthy() and links[1].healthy()  # type: ignore[union-attr]
        ctl = SimpleNamespace(link=hub, step=object(), terminating=False, barrier_read_at=0.0,
                              use=["n0", "n1", "n2", "n3"], hosts=[], adir=str(tmp_path),
                              attempt=0)  # fmt: skip
        assert hub.barrier_steps() == {"1"}
        records(tmp_path, "7.1", [True, True, False, True])  # node 2 unhealthy: no go
        Controller.barrier_files(ctl)  # type: ignore[arg-type]
        records(tmp_path, "7.0", [True, True, True, True])  # another step's: no go
        ctl.barrier_read_at = 0.0
        Controller.barrier_files(ctl)  # type: ignore[arg-type]
        assert links[0].wait_go(0.3) is None  # type: ignore[union-attr]
        records(tmp_path, "7.1", [True, True, True, True])
        ctl.barrier_read_at = 0.0
        Controller.barrier_files(ctl)  # type: ignore[arg-type]
        assert wait_go(links[0]) and wait_go(links[1])  # type: ignore[arg-type]
        assert hub.barrier_steps() is None
        assert links[2].healthy() and wait_go(links[2])  # type: ignore[union-attr, arg-type]
    finally:
        hub.close()
        os.close(r)
        os.close(w)
