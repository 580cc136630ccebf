"""When a node agent's watchers start (runtime/node/agent.py: _watch), on real processes:
a run that asks for GPUs has them sampled from its ranks' start, as before the watchers
waited for a first line or WATCH_AFTER_S (a GPU run that ends within that second was
never sampled: `treb status` showed no GPU, nor `no nvidia-smi on PATH`); a CPU run that
prints nothing still starts none of them before WATCH_AFTER_S (issue 36's noop launch)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from trebuchet.runtime.node import agent as agent_mod
from trebuchet.runtime.node.agent import Agent, Proc

# STAND-IN for nvidia-smi: no GPU exists here (tests/integration/test_progress.py's).
STAND_IN = '#!/bin/sh\necho "0, 42, 30000, 81559"\necho "1, 42, 1000, 81559"\n'
# A silent rank that ends once its node's GPU state is on disk (or after 20 s)
WAITS_FOR_SAMPLE = 'i=0; while [ ! -s "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done'


def _run(tmp_path: Path, metrics: dict[str, object]) -> Agent:
    run_dir = tmp_path / "run"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    state = adir / "gpu" / "node-0.json"
    argv = ["sh", "-c", WAITS_FOR_SAMPLE, "sh", str(state)]
    proc = Proc("rank-0", "0:0", argv, {"PATH": os.environ["PATH"]}, rank=0, local_rank=0)
    agent = Agent([proc], str(adir), str(tmp_path), 1.0)
    agent.start_all()
    deadline = time.monotonic() + 60  # a hang guard, no timing assertion
    while agent.poll():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return agent


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # the watchers' delay for a silent run, as long as a run: only a GPU run's own start
    # can have its GPUs sampled before its end
    monkeypatch.setattr(agent_mod, "WATCH_AFTER_S", 600.0)


@pytest.mark.usefixtures("stand_in")
def test_a_gpu_run_has_its_gpus_sampled_from_its_start(tmp_path: Path) -> None:
    _run(tmp_path, {"ranks": [0], "gpus": 2})
    state = json.loads((tmp_path / "run" / "attempt-0" / "gpu" / "node-0.json").read_text())
    assert [(s["index"], s["util"]) for s in state["samples"]] == [(0, 42.0), (1, 42.0)]
    points = (tmp_path / "run" / "attempt-0" / "metrics" / "gpu-0.jsonl").read_text()
    assert "gpu.util.n0.g0" in points and "gpu.mem.n0.g1" in points, points


@pytest.mark.usefixtures("stand_in")
def test_a_silent_cpu_run_starts_no_watcher_before_the_delay(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    agent = _run_quick(tmp_path)
    assert not agent.watching and agent.gpus is None


def _run_quick(tmp_path: Path) -> Agent:
    adir = tmp_path / "run" / "attempt-0"
    adir.mkdir(parents=True)
    (tmp_path / "run" / "metrics.json").write_text(json.dumps({"ranks": [0]}))
    proc = Proc("rank-0", "0:0", ["true"], {"PATH": os.environ["PATH"]}, rank=0, local_rank=0)
    agent = Agent([proc], str(adir), str(tmp_path), 1.0)
    agent.start_all()
    deadline = time.monotonic() + 60
    while agent.poll():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return agent
