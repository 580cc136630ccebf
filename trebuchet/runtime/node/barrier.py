"""Every node's health checks end before any rank of the attempt starts (issue 35).

A node agent runs its checks (health.py), then reports the verdict to its job controller
and waits for the controller's go before it starts a rank: a rank started while another
node still checks could meet that node's checks (or, with a spec's slow `health_check`,
start work that an unhealthy node is about to stop), and an unhealthy node is excluded
before a single rank ran anywhere. The controller says go once every agent of the
attempt reported healthy; an unhealthy one ends its session (ssh) or the step (Slurm's
teardown), which stops the agents that wait, none of whose ranks started.

- ssh: the agent's line HEALTHY on the session's stdout; the controller's GO line on the
  session's stdin (the lifeline, whose end stops the agent as before);
- Slurm: a `health` line on the agent's link (job/link.py), answered by `go` once all
  the step's tasks said it; where a task has no link (it could not connect), it says so in
  its health-<node>.json record only: the controller reads the attempt's records, one
  reader every FILES_S, and gives the go to the others (Controller.barrier_files); the
  task without a link reads them itself. An agent with a link reads none (64 agents each
  reading 64 records every FILES_S while they waited: O(nodes^2) reads of the shared
  filesystem an attempt), until its link ends;
- local: the supervisor runs every simulated node's checks before it starts any rank
  (launcher/node_health.py): no line to wait for.

Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

import os
import threading
import time

from ..rundir.records import read_json

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Callable

HEALTHY = "treb-healthy"  # ssh: the agent's checks passed, it waits for GO
GO = "go"  # the controller's word: every node is healthy, start the ranks
FILES_S = 0.25  # Slurm without a link: how often the nodes' health records are read


class Gate:
    """The controller's word, set once (go or stop) from whichever thread hears it."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.go = False

    def say(self, go: bool) -> None:
        if not self.event.is_set():
            self.go = go
            self.event.set()

    def wait(self, stopped: Callable[[], bool], poll: float = 0.05) -> bool:
        """Until the word comes (True: go) or `stopped()` (a SIGTERM: False)."""
        while not self.event.wait(poll):
            if stopped():
                return False
        return self.go


def step_id() -> str:
    """This Slurm step (job.step): health records of another step are not this one's."""
    return f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"


def nodes_verdict(adir: str, attempt: int, nnodes: int, steps: set[str]) -> bool | None:
    """The nodes' health records of the attempt's steps (`job.step`) in the shared attempt
    folder: True when every node is healthy, False when one is not, None while one has not
    said."""
    verdict: bool | None = True
    for node in range(nnodes):
        rec = read_json(os.path.join(adir, f"health-{node}.json"))
        if (not isinstance(rec, dict) or rec.get("attempt") != attempt
                or rec.get("step") not in steps):  # fmt: skip
            verdict = None
        elif not rec.get("healthy"):
            return False
    return verdict


def slurm_wait(go: Callable[[float], bool | None], adir: str, attempt: int, nnodes: int,
               stopped: Callable[[], bool],
               files: Callable[[], bool] = lambda: True) -> bool:  # fmt: skip
    """A healthy Slurm task's wait for every node's verdict: True to start its rank, False
    when stopped (a SIGTERM, the attempt's teardown, an unhealthy node's record). `go`:
    the link's word within a timeout (True, False, or None: not yet / no link); `files`:
    whether to read the nodes' records (no link, or it ended), else only the teardown's."""
    if nnodes <= 1:
        return True
    steps = {step_id()}
    next_files = 0.0
    teardown = os.path.join(adir, "teardown")
    while True:
        said = go(0.05)
        if said is not None:
            return said
        if stopped():
            return False
        now = time.monotonic()
        if now >= next_files:
            next_files = now + FILES_S
            if os.path.exists(teardown):
                return False
            verdict = nodes_verdict(adir, attempt, nnodes, steps) if files() else None
            if verdict is not None:
                return verdict
