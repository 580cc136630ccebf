"""The records the workers leave under torchrun, mpirun and horovodrun.

Why: under those launchers trebuchet starts one agent per node (or one mpirun), and an
agent's exit code says only that some worker failed. Each worker therefore runs the
runtime's `worker` (trebuchet/runtime/node/task.py) around its rank, which writes the rank's
outcome to `attempt-<n>/rank-<r>.json`. The supervisor reads those records to name the rank
that failed first, with its exit code, and to tell it from the ranks the agent stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from trebuchet.runtime.contracts.schema import Outcome
from trebuchet.runtime.rundir.records import read_json

# Launchers with agents: trebuchet supervises the agent, each worker records itself.
AGENT_LAUNCHERS = ("torchrun", "mpirun", "horovod")


def rank_records(attempt_dir: Path, node: int | None = None) -> list[Outcome]:
    """The wrappers' records of one attempt (of one node when given), by rank."""
    out: list[Outcome] = []
    for path in attempt_dir.glob("rank-*.json"):
        rec = read_json(str(path))  # None: gone, or not a regular file (a rank's FIFO)
        if isinstance(rec, dict) and (node is None or rec.get("node") == node):
            rec["log"] = str(attempt_dir / f"rank-{rec.get('rank')}.log")
            out.append(cast("Outcome", rec))
    return sorted(out, key=lambda r: r.get("rank") or 0)
