"""The Slurm job controller's attempt after a lost node (runtime/slurm/step.py:
Controller.start -> spare_step, and poll -> spare_ended), in this process with a real agent
link and real agents' ends of it (runtime/job/link.py), and stand-ins for srun, squeue and
scancel (scripts that record what they were asked: there is no Slurm in the fast suite;
tests/integration/test_node_loss.py runs it on the test cluster).

Why: the branches decide whether the survivors' parked agents run the next attempt beside
a spare's new step (told their new place), the parked agents alone (fewer nodes), or a
whole new step; and what happens when the spare's step ends before its agent said so. A
wrong branch starts ranks twice or leaves them waiting for a node that never comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trebuchet.runtime.job import link as agent_link
from trebuchet.runtime.slurm.step import Controller

SRUN = """#!/bin/sh
printf '%s\\n' "$*" >>"$CALLS/srun"
printf '%s\\n' "${TREB_PLACEMENT:-none}" >>"$CALLS/placement"
while [ ! -e "$CALLS/srun-exit" ]; do sleep 0.05; done
exit 1
"""
SQUEUE = """#!/bin/sh
case "$*" in *%N*) echo 'tn[2-4]' ;; *) echo 77.0; echo 77.1 ;; esac
"""
SCANCEL = '#!/bin/sh\nprintf \'%s\\n\' "$*" >>"$CALLS/scancel"\n'
SRUN_ARGS = ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
             "--export=ALL", "--whole", "--no-kill"]  # fmt: skip


def until(check: Any, wait: float = 10.0) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


class Setup:
    """A controller after attempt 0 lost tn1 (node 0 of tn1..tn3): the survivors' agents
    (tn2, tn3) parked in their step, which a real process stands in for (srun waits for
    the lost node's task); the allocation's spare is tn4."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = tmp_path / "calls"
        self.calls.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, text in (("srun", SRUN), ("squeue", SQUEUE), ("scancel", SCANCEL)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("CALLS", str(self.calls))
        monkeypatch.setenv("SLURM_JOB_ID", "77")
        monkeypatch.setenv("MASTER_ADDR", "tn2")
        monkeypatch.setenv("MASTER_PORT", "29555")
        for name in (agent_link.ENV, agent_link.PARK_ENV):  # open_link sets them: restored
            monkeypatch.setenv(name, "")
        run_dir = tmp_path / "run"
        (run_dir / "attempt-1").mkdir(parents=True)
        job = {"run_id": "r1", "run_dir": str(run_dir), "workdir": str(tmp_path),
               "launcher": "native", "nodes": 3, "ppn": 1, "grace": 0.5,
               "checkpoint_signal": "SIGUSR2", "command": ["true"], "mpi_env": [],
               "max_attempts": 2, "srun": SRUN_ARGS, "srun_hook": SRUN_ARGS[:5],
               "inline": False, "spec_env": [], "secrets": []}  # fmt: skip
        path = run_dir / "job.json"
        path.write_text(json.dumps(job))
        self.ctl = Controller(job, str(path), str(tmp_path / "runtime.pyz"))  # type: ignore[arg-type]
        self.ctl.open_link()
        assert self.ctl.link is not None
        self.hub = self.ctl.link
        self.ctl.hosts = ["tn1", "tn2", "tn3", "tn4"]
        self.ctl.attempt, self.ctl.adir = 1, str(run_dir / "attempt-1")
        self.hub.expect(attempt=0, tasks=3)
        links = [agent_link.open_link(0, f"0.{t}", f"tn{t + 1}") for t in range(3)]
        assert all(link is not None for link in links)
        self.survivors: list[agent_link.Link] = [ln for ln in links[1:] if ln is not None]
        self.stopped: list[str] = []
        for link in self.survivors:
            link.on_stop = lambda host=link.host: self.stopped.append(host)  # type: ignore[misc]
            link.park(0)
        assert until(lambda: self.hub.parked_count() == 2)
        # the lost node's step: srun waits for tn1's task (a real process stands in)
        self.kept = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.ctl.kept = self.kept

    def srun_calls(self) -> list[str]:
        path = self.calls / "srun"
        return path.read_text().splitlines() if path.exists() else []

    def placements(self) -> list[str]:
        return (self.calls / "placement").read_text().splitlines()

    def spare_step_ends(self, spoke: bool) -> None:
        """Attempt 1 on tn2, tn3 (parked, now running) and the spare tn4, whose step then
        ends (srun exit 1); `spoke`: the spare's agent said hello before."""
        self.ctl.use = ["tn2", "tn3", "tn4"]
        self.ctl.start(1)
        assert until(lambda: len(self.srun_calls()) == 1)
        for link in self.survivors:
            assert link.wait_next(lambda: False) == 1
            link.next_attempt(1)
        if spoke:
            assert agent_link.open_link(1, "1.0", "tn4") is not None
            assert until(lambda: len(self.hub.tasks) == 3)
        (self.calls / "srun-exit").touch()
        assert self.ctl.step is not None
        self.ctl.step.wait(timeout=10)

    def close(self) -> None:
        (self.calls / "srun-exit").touch()
        for p in [self.kept, self.ctl.step]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self.hub.close()


def scancelled(setup: Setup) -> list[str]:
    """The scancel calls so far, each once, in order of step (they run side by side; the
    link's overdue stop and the spare's end may both ask)."""
    path = setup.calls / "scancel"
    return sorted(set(path.read_text().splitlines())) if path.exists() else []


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    s = Setup(tmp_path, monkeypatch)
    yield s
    s.close()


def test_the_spare_gets_a_step_of_its_own_and_the_survivors_their_new_place(setup: Setup) -> None:
    """tn2, tn3 parked, tn4 the spare: one new srun step on tn4 alone (--overlap, the
    rendered --no-kill, its node rank in TREB_PLACEMENT), and the parked agents are told
    their new node rank, the node count and the master; not a whole new step."""
    ctl = setup.ctl
    ctl.use = ["tn2", "tn3", "tn4"]
    ctl.start(1)
    assert until(lambda: len(setup.srun_calls()) == 1)
    argv = setup.srun_calls()[0].split()
    assert argv[:3] == ["--nodes=1", "--ntasks=1", "--nodelist=tn4"], argv
    assert "--overlap" in argv and "--no-kill" in argv and "task" in argv, argv
    assert setup.placements() == ["3;tn4=2;tn2,tn3,tn4;tn[2-4]"]  # the job's: Slurm's word
    assert ctl.spare_hosts == ["tn4"] and ctl.step_use == ["tn2", "tn3", "tn4"]
    for node, link in enumerate(setup.survivors):
        assert link.wait_next(lambda: False) == 1
        assert link.placement == agent_link.Placement(node, 3, "tn2", "29555", "tn2,tn3,tn4",
                                                      "tn[2-4]")  # fmt: skip
    assert ctl.step is not None and ctl.step is not setup.kept


def test_fewer_nodes_run_on_the_parked_agents_alone(setup: Setup) -> None:
    """A node range with no spare left (`use` is the survivors): no step at all; the
    lost node's step, in which they are parked, is the attempt's."""
    ctl = setup.ctl
    ctl.use = ["tn2", "tn3"]
    ctl.start(1)
    assert ctl.step is setup.kept and ctl.spare_hosts == []
    assert setup.srun_calls() == []
    for node, link in enumerate(setup.survivors):
        assert link.wait_next(lambda: False) == 1
        assert link.placement == agent_link.Placement(node, 2, "tn2", "29555", "tn2,tn3",
                                                      "tn[2-4]")  # fmt: skip


@pytest.mark.parametrize("why", ["kept step ended", "a scancel on its way", "parked elsewhere"])
def test_otherwise_a_whole_new_step_runs_on_every_node(why: str, setup: Setup) -> None:
    """The parked agents' step already ended, a signal of ours is still on its way to the
    steps, or a parked agent is on a node the attempt does not use: a whole new step on
    every node of the attempt (no placement), the parked agents released."""
    ctl = setup.ctl
    ctl.use = ["tn2", "tn3", "tn4"]
    if why == "kept step ended":
        setup.kept.kill()
        setup.kept.wait(timeout=10)
    elif why == "a scancel on its way":
        ctl.scancels.append(subprocess.Popen([sys.executable, "-c", "import time; "
                                              "time.sleep(60)"]))  # fmt: skip
    else:
        ctl.use = ["tn3", "tn4", "tn5"]  # tn2's parked agent is not in this attempt
    try:
        ctl.start(1)
        assert until(lambda: len(setup.srun_calls()) == 1)
        argv = setup.srun_calls()[0].split()
        nodes = ",".join(ctl.use)
        assert argv[:3] == ["--nodes=3", "--ntasks=3", f"--nodelist={nodes}"], argv
        assert setup.placements() == ["none"] and ctl.spare_hosts == []
        for link in setup.survivors:  # released: `exit`, not a next attempt
            assert link.wait_next(lambda: False) is None
    finally:
        for p in ctl.scancels:
            p.kill()
            p.wait(timeout=10)


def test_a_spares_step_that_ends_first_stops_the_others_then_the_attempt_ends(
    setup: Setup,
) -> None:
    """The spare's step ends (srun exit 1) before its agent said hello: the parked agents
    are stopped (the spare never spoke, so the stop cannot reach every agent: scancel
    --signal=TERM to the job's steps too); the attempt goes on until they ended, then
    ends with srun's code (once they ended: not after the grace period, a minute here)."""
    ctl = setup.ctl
    ctl.job["grace"] = 60
    setup.spare_step_ends(spoke=False)
    assert ctl.poll()  # the others still run: the attempt goes on
    assert until(lambda: sorted(setup.stopped) == ["tn2", "tn3"])
    assert until(lambda: scancelled(setup) == ["--signal=TERM 77.0", "--signal=TERM 77.1"])
    for link in setup.survivors:
        link.ended(143)
    assert until(lambda: not ctl.poll())
    assert ctl.rc == 1


def test_a_spares_step_whose_others_do_not_end_is_scancelled_after_the_grace(
    setup: Setup,
) -> None:
    """The same, where the spare spoke (the stop reaches every agent over the link), but
    the parked agents never end: after the grace period + 2 s the steps get scancel
    --signal=TERM, and the attempt ends."""
    ctl = setup.ctl
    setup.spare_step_ends(spoke=True)
    assert ctl.poll()
    assert until(lambda: sorted(setup.stopped) == ["tn2", "tn3"])
    assert until(lambda: not ctl.poll())
    assert until(lambda: scancelled(setup) == ["--signal=TERM 77.0", "--signal=TERM 77.1"])
