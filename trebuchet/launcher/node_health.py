"""The local engine's node health checks: runtime/node/health.py's, once per simulated node
before each attempt's ranks start (the supervisor drives its node agents in-process, so
it runs their checks too), under the simulated nodes' names (sim_nodes.py: node-0, ...)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from trebuchet.runtime.contracts.schema import FirstFailure
from trebuchet.runtime.node import health
from trebuchet.runtime.node.agent import Agent
from trebuchet.runtime.rundir.records import read_json


def check_nodes(run_dir: str, adir: Path, attempt: int, agents: list[Agent],
                conf: Mapping[str, Any], names: list[str] | None = None,
                ) -> FirstFailure | None:  # fmt: skip
    """Every simulated node's checks (in parallel: the spec's own check may take a
    while); the first unhealthy node's record (lost-<node>.json), or None. `names`: the
    attempt's simulated nodes by NODE_RANK (sim_nodes.py), else node-<NODE_RANK>."""
    wheres = []
    for agent in agents:
        p = agent.procs[0]
        node = int(p.node or 0)
        name = names[node] if names and node < len(names) else f"node-{node}"
        wheres.append(health.Where(run_dir, str(adir), attempt, node, name,
                                   p.cwd or os.getcwd(), p.env))  # fmt: skip
    if len(wheres) > 1 and conf.get("health_check"):
        from concurrent.futures import ThreadPoolExecutor  # here: +1 MiB for every run

        with ThreadPoolExecutor(len(wheres)) as pool:
            verdicts = list(pool.map(lambda w: health.gate(w, conf, durable=False), wheres))
    else:
        verdicts = [health.gate(w, conf, durable=False) for w in wheres]
    for agent, where in zip(agents, wheres, strict=True):
        agent.defer(os.path.join(where.adir, f"health-{where.node}.json"))
    for where, why in zip(wheres, verdicts, strict=True):
        if why is not None:
            rec = read_json(os.path.join(where.adir, f"lost-{where.node}.json"))
            return cast(FirstFailure, rec) if isinstance(rec, dict) else None
    return None
