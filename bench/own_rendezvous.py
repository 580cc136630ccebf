"""A program with its own rendezvous on MASTER_PORT (tests/integration/scripts/
own_rendezvous.py: rank 0 accepts WORLD_SIZE-1 connections and reads one JSON line from
each; anything else that connects fails it), run again and again on the ssh test hosts
(2 hosts x 2 ranks) and on the Slurm test cluster (8 nodes x 1 rank, partition `big`),
each run with the nodes' health checks (and a spec `health_check`). Issue 35: treb's own
checks used to connect to that port and a node's check could run after another node's
ranks had started: 1 run in 3 failed on ssh. The figure is the failures out of the runs.

Run with both up: scripts/with-slurm-cluster scripts/with-ssh-hosts \\
    python bench/own_rendezvous.py [--runs 30] [--engines ssh,slurm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = REPO / "tests" / "integration" / "scripts" / "own_rendezvous.py"
CONF = os.environ.get("TREB_SSH_CONFIG", "/var/tmp/treb-ssh-hosts/ssh_config")
SHAPES = {
    "ssh": f"nodes: 2\nprocs_per_node: 2\nssh: {{hosts: [ts1, ts2], config_file: {CONF}}}\n",
    "slurm": "nodes: 8\nprocs_per_node: 1\nslurm: {partition: big}\n",
}


def one(engine: str, home: Path, spec: Path) -> tuple[bool, str]:
    """One run, attached: whether it succeeded, and what it said when it did not."""
    env = {**os.environ, "TREB_HOME": str(home)}
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec), "--on", engine],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    if res.returncode == 0:
        return True, ""
    st = subprocess.run([sys.executable, "-m", "trebuchet", "status", "--json"], env=env,
                        capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    ff = (json.loads(st or "{}") or {}).get("first_failure") or {}
    return False, str(ff.get("message") or res.stderr.strip().splitlines()[-1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--engines", default="ssh,slurm")
    args = ap.parse_args()
    total_failed = 0
    with tempfile.TemporaryDirectory(prefix="treb-rdzv-", dir="/tmp") as tmp:
        for engine in args.engines.split(","):
            work = Path(tmp) / engine
            work.mkdir()
            spec = work / "job.yaml"
            spec.write_text(f"name: own-rdzv-{engine}\ncommand: {sys.executable} {PROGRAM}\n"
                            f"health_check: 'true'\nsnapshot: false\n{SHAPES[engine]}")  # fmt: skip
            failed: list[str] = []
            t0 = time.time()
            for i in range(args.runs):
                ok, why = one(engine, work / "home", spec)
                if not ok:
                    failed.append(f"run {i + 1}: {why}")
            print(f"{engine}: {len(failed)} of {args.runs} runs failed "
                  f"({time.time() - t0:.0f}s)", flush=True)  # fmt: skip
            for line in failed:
                print(f"  {line}")
            total_failed += len(failed)
    print(f"total: {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
