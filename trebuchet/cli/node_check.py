"""`treb check --nodes N [SPEC] --on local|slurm`: the nodes' health checks
(runtime/node/health.py, the same the node agents run before every attempt's ranks) on N
nodes now, each node's result printed. Exit 0 when every node is healthy, 1 when one is
not (or gave no result), 2 on bad input (no node, an engine without it, srun refusing
the request or finding no N free nodes within WAIT_S).

Slurm: one `srun -N N --ntasks-per-node=1` task per node runs the runtime's `health`
verb against a folder under TREB_HOME (which the nodes share, as they share run
directories), with a token file written here: a node that reads another token, or none,
does not see the shared folder. Locally: N simulated nodes, in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.runtime.contracts.rank_env import node_vars
from trebuchet.runtime.node import health

ENGINES = ("local", "slurm")
SRUN_TIMEOUT_S = 600.0
WAIT_S = 60  # srun --immediate: N free nodes within this, else no check (exit 2, said why)


def _conf(args: argparse.Namespace) -> tuple[dict[str, Any], str, Any]:
    """The spec's health settings and workdir (none without a spec), and the spec."""
    if not args.spec:
        return {}, os.getcwd(), None
    from trebuchet.launcher.recovery import health_fields
    from trebuchet.spec.load import load_spec

    loaded = load_spec(args.spec, args.override)
    return health_fields(loaded.spec), str(loaded.workdir), loaded.spec


def _local(folder: Path, n: int, conf: dict[str, Any], workdir: str, token: str) -> list[dict]:
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


def _slurm(folder: Path, n: int, spec: Any, token: str) -> list[dict]:
    from trebuchet.launcher.runtime_file import ship

    runtime = ship(folder)
    argv = ["srun", f"--nodes={n}", "--ntasks-per-node=1", "--quiet",
            f"--immediate={WAIT_S}", f"--job-name=treb-check-{folder.name}"]  # fmt: skip
    partition = getattr(getattr(spec, "slurm", None), "partition", None)
    if partition:
        argv.append(f"--partition={partition}")
    argv += ["python3", "-S", str(runtime), "health", str(folder), token]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=SRUN_TIMEOUT_S)
    except FileNotFoundError:
        raise UserError("treb check --nodes --on slurm: srun is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"treb check --nodes: srun gave no answer in {SRUN_TIMEOUT_S:g}s") from None
    found = []
    for line in res.stdout.splitlines():
        if line.startswith("treb-health "):
            try:
                found.append(json.loads(line.split(" ", 1)[1]))
            except ValueError:
                continue
    if not found:
        said = (res.stderr.strip().splitlines() or [f"srun exited {res.returncode}"])[-1]
        raise UserError(f"treb check --nodes {n} --on slurm: no node answered: {said}")
    return sorted(found, key=lambda r: int(r.get("node") or 0))


def main(args: argparse.Namespace) -> int:
    n = args.nodes
    if n < 1:
        raise UserError("treb check --nodes: at least 1")
    if args.on not in ENGINES:
        raise UserError(f"treb check --nodes: --on {' or '.join(ENGINES)} (not {args.on})")
    conf, workdir, spec = _conf(args)
    from trebuchet.store.paths import treb_home

    folder = treb_home() / "health-checks" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (folder / "attempt-0").mkdir(parents=True, mode=0o700)
    token = secrets.token_hex(16)
    try:
        (folder / health.TOKEN_FILE).write_text(token + "\n")
        (folder / "health.json").write_text(json.dumps({**conf, "workdir": workdir}))
        t0 = time.monotonic()
        if args.on == "local":
            found = _local(folder, n, conf, workdir, token)
        else:
            found = _slurm(folder, n, spec, token)
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
