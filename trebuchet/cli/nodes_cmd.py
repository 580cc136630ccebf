"""`treb nodes`: each node's history across runs, its decaying score and whether new
submissions avoid it (docs/nodes.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from trebuchet.errors import UserError
from trebuchet.store.db import Store
from trebuchet.store.node_events import KINDS, node_name
from trebuchet.store.nodes import Settings, clear, known_hosts, nodes, sync


def main(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    for host in args.clear:
        if node_name(host) is None:
            raise UserError(f"--clear {host!r}: not a node name (letters, digits, . _ -; "
                            "not starting with - or .)")  # fmt: skip
    store = Store()
    sync(store)
    if args.clear or args.clear_all:
        given = [str(node_name(h)) for h in args.clear]  # ssh's user@host: the host
        hosts = known_hosts(store) if args.clear_all else list(dict.fromkeys(given))
        unknown = [h for h in hosts if h not in known_hosts(store)]
        clear(store, hosts)
        for host in hosts:
            said = " (it had no history)" if host in unknown else ""
            print(f"treb: node {host}: history cleared{said}; new runs may use it",
                  file=sys.stderr if args.json else sys.stdout)  # fmt: skip
        if not args.json:
            return 0
    found = nodes(store, settings)
    if args.json:
        print(json.dumps({"half_life_s": settings.half_life_s, "threshold": settings.threshold,
                          "nodes": [n.to_json() for n in found]}, indent=2))  # fmt: skip
        return 0
    if not found:
        print("no node has a history yet (lost, unhealthy, hardware errors, straggler)")
        return 0
    from trebuchet.cli.table import print_table

    rows = []
    for n in found:
        last = "-"
        if n.cleared is not None:
            last = f"cleared {time.strftime('%Y-%m-%d %H:%M', time.localtime(n.cleared))}"
        if n.last_time is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(n.last_time))
            detail = f", {n.last_detail}" if n.last_detail else ""
            last = f"{stamp} {n.last_kind} (run {n.last_run}{detail})"
        rows.append([n.host, f"{n.score:.2f}", "yes" if n.excluded else "no",
                     *(str(n.counts.get(k, 0)) for k in KINDS), last])  # fmt: skip
    print_table(["HOST", "SCORE", "EXCLUDED", *(k.upper() for k in KINDS), "LAST"], rows)
    half = settings.half_life_s / 3600
    limit = (f"avoided at {settings.threshold:g} or more" if settings.threshold > 0
             else "none avoided")  # fmt: skip
    print(
        f"score: each mark halves every {half:g}h; {limit} (TREB_NODE_HALF_LIFE, "
        "TREB_NODE_THRESHOLD)"
    )
    return 0
