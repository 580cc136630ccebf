"""`treb check --nodes N` on the local engine: N simulated nodes' health checks, in this
process (runtime/node/health.py's, as the supervisor runs them before every attempt)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trebuchet.runtime.contracts.rank_env import node_vars
from trebuchet.runtime.node import health


def check(
    folder: Path, n: int, conf: dict[str, Any], workdir: str, token: str
) -> list[dict[str, Any]]:
    from trebuchet.launcher.plan import free_port

    port = str(free_port())
    out = []
    for node in range(n):
        env = {**os.environ, **node_vars(node, n), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "TREB_CHECKPOINT_DIR": str(folder / "checkpoints")}  # fmt: skip
        where = health.Where(str(folder), str(folder / "attempt-0"), 0, node, f"node-{node}",
                             workdir, env)  # fmt: skip
        checks = health.run_checks(where, conf, token=token)
        out.append({"node": node, "host": where.host, "healthy": all(c.ok for c in checks),
                    "seconds": round(sum(c.seconds for c in checks), 6),
                    "checks": [c._asdict() for c in checks]})  # fmt: skip
    return out
