"""Suggestions `treb check` prints beside its findings: advice, not a problem (a spec
without them is sound, and `treb run` does not repeat them)."""

from __future__ import annotations

from typing import Any


def suggestions(spec: Any) -> list[str]:
    """hang_timeout for a multi-node run: without it a hung rank keeps every node idle until
    the collective's own timeout (often 30 min) or the time limit ends the job."""
    if spec.nodes < 2 or spec.hang_timeout is not None:
        return []
    return [
        f"{spec.nodes} nodes and no hang_timeout: set one (e.g. hang_timeout: 10m, longer "
        "than the slowest stretch in which no rank prints: a checkpoint, an evaluation) to "
        "get every rank's stack and stop a hung run (docs/hangs.md)"
    ]
