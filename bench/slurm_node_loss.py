"""Time from a node's death to all ranks of the next attempt running (issue 23), and from
the loss's detection (the `node_lost` event) to that restart alone, on Slurm.

On the Slurm test cluster (`big` partition): a run with `nodes: 2` (--nodes), `spare_nodes:
1`, `retries: 1`, ranks of bench/tiny_rank.sh; once all ranks run (each writes the time it
started into a shared folder),
the attempt's second node dies as a machine does: its link down, then every process in its
namespace SIGKILLed (slurmd, the step, the agent, the rank). The next attempt's ranks (on
the first node and the spare) write their start times; the round's figures are the last of
those minus the kill, and minus the event's time. The run is then cancelled and the node
brought back (`cluster.sh up`, `scontrol update State=RESUME`). Medians of ROUNDS.

Usage (root): scripts/with-slurm-cluster python bench/slurm_node_loss.py [--rounds 5]
    [--node-timeout 5]
  at scale: TREB_SLURM_NODES=33 scripts/with-slurm-cluster python bench/slurm_node_loss.py \
    --nodes 32 --procs 8 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/dead_machine.py
from tests.dead_machine import kill_namespace  # noqa: E402

CLUSTER = REPO / "tests" / "slurm_cluster" / "cluster.sh"
TINY = REPO / "bench" / "tiny_rank.sh"  # writes STAMPS/<attempt>-<rank>: "<time> <pid>"


def treb(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TREB_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip


def wait(what: str, ok, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def kill_node(name: str) -> None:
    kill_namespace(name, f"treb-{name}")


def bring_back(name: str) -> None:
    subprocess.run(["ip", "link", "set", f"treb-{name}", "up"], timeout=30)
    subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, timeout=300, check=True)
    subprocess.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"],
                   capture_output=True, timeout=60)  # fmt: skip


def ready(stamps: Path, attempt: int) -> list[float]:
    return [float(p.read_text().split()[0]) for p in stamps.glob(f"{attempt}-*")
            if not p.name.endswith(".tmp")]  # fmt: skip


def one_round(work: Path, node_timeout: float, nodes: int, procs: int) -> tuple[float, float]:
    home, stamps = work / "home", work / "stamps"
    stamps.mkdir(parents=True)
    world = nodes * procs
    (work / "job.yaml").write_text(
        f"name: node-loss\ncommand: bash {TINY}\nnodes: {nodes}\nprocs_per_node: {procs}\n"
        f"spare_nodes: 1\nretries: 1\nnode_timeout: {node_timeout:g}s\nsnapshot: false\n"
        f"env:\n  STAMPS: {stamps}\nslurm:\n  partition: big\n"
    )
    res = treb(home, "run", str(work / "job.yaml"), "--on", "slurm", "--detach")
    if res.returncode != 0:
        raise SystemExit(res.stderr)
    rid = res.stdout.strip()
    run_dir = home / "runs" / rid
    wait("the first attempt's ranks", lambda: len(ready(stamps, 0)) == world, 600)
    first = json.loads((run_dir / "attempt-0" / "attempt.json").read_text())["nodes"]
    if "[" in first:  # a hostlist
        first = ",".join(subprocess.run(["scontrol", "show", "hostnames", first],
                                        capture_output=True, text=True).stdout.split())  # fmt: skip
    victim = first.split(",")[1]
    killed = time.time()
    kill_node(victim)
    try:
        wait("the next attempt's ranks", lambda: len(ready(stamps, 1)) == world, 600)
        started = max(ready(stamps, 1))
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        detected = next(float(e["time"]) for e in events if e.get("event") == "node_lost")
        batch = (run_dir / "batch.log").read_text()
        how = "a step on the spare alone" if "and a new step on" in batch else "a whole new step"
        print(f"the next attempt: {how}", flush=True)
    finally:
        treb(home, "cancel", rid)
        bring_back(victim)
    return started - killed, started - detected


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--node-timeout", type=float, default=5.0)
    ap.add_argument("--nodes", type=int, default=2, help="plus one spare (issue 36: 32, 64)")
    ap.add_argument("--procs", type=int, default=1, help="ranks per node")
    args = ap.parse_args()
    deaths, restarts = [], []
    for n in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="treb-node-loss-", dir="/var/tmp") as tmp:
            death, restart = one_round(Path(tmp), args.node_timeout, args.nodes, args.procs)
        deaths.append(death)
        restarts.append(restart)
        print(f"round {n + 1}: death -> next attempt's ranks running {death:.2f}s, "
              f"detection -> running {restart:.2f}s", flush=True)  # fmt: skip
    print(f"slurm, {args.nodes} nodes x {args.procs} + 1 spare, node_timeout "
          f"{args.node_timeout:g}s, median of {args.rounds}: death -> "
          f"ranks running {statistics.median(deaths):.2f}s, detection -> ranks running "
          f"{statistics.median(restarts):.2f}s")  # fmt: skip


if __name__ == "__main__":
    main()
