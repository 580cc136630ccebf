"""The local engine's simulated nodes as nodes that can be lost (issue 23, docs/recovery.md).

Locally every simulated node's agent is an object in the supervisor's process, so "a
node's agent killed" needs a process to kill: with more than one node (or spare_nodes),
each simulated node of an attempt gets a keeper, a small process of its own that carries
the run's TREB_RUN_ID and the node's NODE_RANK (what `treb fault RUN kill-node N`, or a
`kill -9`, finds with the node's ranks) and lives until the supervisor closes its stdin.
A keeper that dies on its own is that node's death, which the engine sees at once (its
exit, no heartbeat needed): the node's ranks are killed too (a dead node runs nothing),
the loss is recorded as on every engine (runtime/job/nodeloss.py: `lost-<node>.json`, the
event, the exclusion), and the next attempt runs on the nodes left plus a spare.

Simulated nodes are named node-0, node-1, ... (the spares after the first `nodes`); an
attempt's NODE_RANK k runs as the k-th node not excluded. The ranks themselves run on this
machine either way: a spare costs nothing until it is used.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from trebuchet.runtime.contracts.schema import ProcPlan
from trebuchet.runtime.job import nodeloss
from trebuchet.runtime.rundir.records import append_event, exit_fields

if TYPE_CHECKING:
    from trebuchet.runtime.contracts.schema import FirstFailure

SHRINKS = ("native", "none")  # launchers whose ranks the plan places one by one

KEEPER = "import sys; sys.stdin.buffer.read()"  # ends when the supervisor closes stdin


def names(nodes: int, spares: int) -> list[str]:
    return [f"node-{i}" for i in range(nodes + spares)]


class Keepers:
    """The keepers of one attempt's simulated nodes (see the module's docstring)."""

    def __init__(self, run_dir: str, run_id: str, held: list[str], want: int,
                 least: int | None = None, shrinks: bool = True) -> None:  # fmt: skip
        self.run_dir, self.run_id, self.held, self.want = run_dir, run_id, held, want
        self.least = least if shrinks else None  # nodes: MIN:MAX (native and none only)
        self.active: list[str] = held[:want]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.attempt = 0
        self.lost: dict[int, FirstFailure] = {}  # by NODE_RANK, this attempt's

    def start(self, attempt: int) -> list[str]:
        """This attempt's nodes (the first `want` not excluded: node 0 first) and their
        keepers; [] when too few are left (the previous attempt's ending said so)."""
        choice = nodeloss.next_nodes(self.run_dir, self.held, self.want, self.least)
        self.active, self.attempt, self.lost = choice.hosts, attempt, {}
        append_event(self.run_dir, "nodes", attempt=attempt, hosts=self.active)
        env = {**os.environ, "TREB_RUN_ID": self.run_id, "TREB_ATTEMPT": str(attempt)}
        self.procs = [
            subprocess.Popen([sys.executable, "-S", "-c", KEEPER], stdin=subprocess.PIPE,
                             start_new_session=True,
                             env={**env, "NODE_RANK": str(k), "TREB_NODE_NAME": name})
            for k, name in enumerate(self.active)
        ]  # fmt: skip
        return self.active

    def gone(self, after: bool = False) -> list[int]:
        """NODE_RANKs whose keeper died on its own and was not yet taken as lost (`after`:
        the attempt had failed already, so their loss is no cause: nodeloss.record)."""
        out = []
        for k, p in enumerate(self.procs):
            if k not in self.lost and p.poll() is not None:
                self.lost[k] = self.record(k, p.returncode, after)
                out.append(k)
        return out

    def record(self, k: int, returncode: int, after: bool = False) -> FirstFailure:
        code, sig = exit_fields(returncode)
        how = f"killed by {sig}" if sig else f"exit code {code}"
        host = self.active[k]
        message = nodeloss.dropped(host, f"its node agent ended without its last word: {how}")
        return nodeloss.record(self.run_dir, self.attempt, k, host, message, time.time(),
                               after=after)  # fmt: skip

    def close(self, after: bool = False) -> None:
        """The attempt is over: what died before counts (gone), then the rest end."""
        self.gone(after)
        for p in self.procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def next_ok(self) -> str:
        """Why no next attempt can run ("" when one can)."""
        return nodeloss.next_nodes(self.run_dir, self.held, self.want, self.least).why_not

    def plans(self, procs: list[ProcPlan], ppn: int) -> list[ProcPlan]:
        """The attempt's processes: the plan's, or those of its first nodes with the world
        shrunk to them (WORLD_SIZE and the node count follow) once fewer nodes are left."""
        k = len(self.active)
        if k >= self.want:
            return procs
        world = {"WORLD_SIZE": str(k * ppn), "ROLE_WORLD_SIZE": str(k * ppn),
                 "GROUP_WORLD_SIZE": str(k), "NUM_NODES": str(k)}  # fmt: skip
        out: list[ProcPlan] = []
        for p in procs:
            if p["node"] < k:
                env = {n: world.get(n, v) for n, v in p["env"].items()}
                out.append({**p, "env": env})
        return out
