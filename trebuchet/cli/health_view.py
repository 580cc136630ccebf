"""The nodes' health checks as `treb status` shows them (runtime/node/health.py writes
`attempt-N/health-<node>.json` before each attempt's ranks)."""

from __future__ import annotations

import os
from typing import Any

from trebuchet.runtime.node.health import summary


def health_json(run_dir: str) -> dict[str, list[dict[str, Any]]]:
    """Every attempt's records, by attempt number from 1 (as `treb status` counts)."""
    out: dict[str, list[dict[str, Any]]] = {}
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    for name in names:
        head, _, num = name.partition("-")
        if head == "attempt" and num.isdigit():
            recs = summary(os.path.join(run_dir, name))
            if recs:
                out[str(int(num) + 1)] = recs
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def health_lines(run_dir: str, attempt: int) -> list[str]:
    """One line per node of the attempt (from 0): healthy and how long the checks took,
    or which checks failed and why."""
    recs = summary(os.path.join(run_dir, f"attempt-{attempt}"))
    lines = []
    for r in recs:
        took = f"{float(r.get('seconds') or 0) * 1000:.0f} ms"
        head = f"node {r.get('node')} {r.get('host')}"
        if r.get("healthy"):
            lines.append(f"{head}: healthy ({took})")
            continue
        bad = [c for c in r.get("checks") or [] if isinstance(c, dict) and not c.get("ok")]
        why = "; ".join(f"{c.get('name')}: {c.get('detail')}" for c in bad)
        lines.append(f"{head}: UNHEALTHY ({why}) ({took})")
    return lines
