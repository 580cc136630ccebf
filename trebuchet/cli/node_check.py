"""`treb check --nodes N`: the nodes' health checks (runtime/node/health.py, those the
agents run before every attempt) on N nodes now. Slurm runs the runtime's `health` verb
on each node against a folder under TREB_HOME, which the nodes share, with a token file
written here: a node that reads another token, or none, does not see the shared folder.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import time
from typing import Any

from trebuchet.errors import UserError
from trebuchet.runtime.node import health


def _conf(args: argparse.Namespace) -> tuple[dict[str, Any], str, Any]:
    """The spec's health settings and workdir (none without a spec), and the spec."""
    if not args.spec:
        return {}, os.getcwd(), None
    from trebuchet.backends.job_file import health_fields
    from trebuchet.spec.load import load_spec

    loaded = load_spec(args.spec, args.override)
    return health_fields(loaded.spec), str(loaded.workdir), loaded.spec


def main(args: argparse.Namespace) -> int:
    n = args.nodes
    if n < 1:
        raise UserError("treb check --nodes: at least 1")
    from trebuchet.backends import get_backend, names

    engine = get_backend(args.on)
    if not engine.node_checks:
        able = [n for n in names() if get_backend(n).node_checks]
        raise UserError(f"treb check --nodes: --on {' or '.join(able)} (not {args.on})")
    conf, workdir, spec = _conf(args)
    from trebuchet.store.paths import treb_home

    folder = treb_home() / "health-checks" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (folder / "attempt-0").mkdir(parents=True, mode=0o700)
    token = secrets.token_hex(16)
    try:
        (folder / health.TOKEN_FILE).write_text(token + "\n")
        (folder / "health.json").write_text(json.dumps({**conf, "workdir": workdir}))
        t0 = time.monotonic()
        found = engine.check_nodes(folder, n, conf, workdir, spec, token)
        took = time.monotonic() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    bad = [r for r in found if not r.get("healthy")] + [{}] * max(0, n - len(found))
    if args.json:
        missing = max(0, n - len(found))
        print(json.dumps({"backend": args.on, "ok": not bad, "nodes": found,
                          "missing": missing, "seconds": took}, indent=2))  # fmt: skip
        return 1 if bad else 0
    for r in found:
        state = "healthy" if r.get("healthy") else "UNHEALTHY"
        print(f"node {r.get('node')} {r.get('host')}: {state} "
              f"({float(r.get('seconds') or 0) * 1000:.0f} ms of checks)")  # fmt: skip
        for c in r.get("checks") or []:
            print(f"  {c.get('name'):<8} {'ok' if c.get('ok') else 'FAILED':<6} {c.get('detail')}")
    if len(found) < n:
        print(f"{n - len(found)} node(s) gave no result")
    print(f"treb check: {len(bad)} of {n} node(s) unhealthy (--on {args.on}, {took:.2f}s)")
    return 1 if bad else 0
