"""`treb fault` on the local engine: the simulated nodes of the latest attempt, and the
runtime's fault verb called in this process (the ranks are this machine's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.runtime.node import fault
from trebuchet.store.files import read_events

if TYPE_CHECKING:
    from trebuchet.store.db import RunRecord


def nodes(run: RunRecord) -> list[str]:
    """The latest attempt's simulated nodes (a spare in: sim_nodes), node 0 first."""
    chosen = [e.get("hosts") for e in read_events(Path(run.run_dir)) if e.get("event") == "nodes"]
    hosts = chosen[-1] if chosen else None
    if isinstance(hosts, list) and hosts and all(isinstance(h, str) for h in hosts):
        return hosts
    return [f"node-{n}" for n in range(int(run.nodes or 1))]


def inject(run: RunRecord, action: str, target: str | None, node: int | None) -> int:
    if action == fault.KILL_NODE:
        return 0 if fault.kill_node(run.id, node) else 1
    if action == fault.HANG_RANK:
        return 0 if fault.hang_rank(run.run_dir, run.id, int(str(target))) else 1
    return 0 if fault.preempt(run.run_dir, run.id) else 1
