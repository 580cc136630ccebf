"""What progress parsing (runtime/watch/eta.py) and GPU sampling (runtime/watch/gpu.py) cost a
node agent, in CPU seconds per second of the agent's own process (one node).

Each measurement is a fresh process running one runtime Agent (what a node runs: the
Slurm task's, the ssh/SkyPilot/Kubernetes node agent, one of the local supervisor's) over
2 ranks for `--seconds`, and reads its own CPU time (getrusage RUSAGE_SELF: the agent's
process only, not its children). Variants, alternated per round so machine noise hits them
alike (median of the rounds):
  base      the agent as before issue 27: its log reader with the metrics hook only
  progress  + the first rank's progress parsed and recorded (progress.json)
  gpu       + progress + GPU sampling every 10 s (the default), with a stand-in
            `nvidia-smi` (a shell script: no GPU here; the real one's own CPU is its
            child's, not the agent's, as is the stand-in's)
  gpu-1s    the same sampling every second, to see the per-sample cost above noise
The ranks print a tqdm bar (`--rate` updates a second, rank 0's is parsed) or, with
`--flood`, `step i/N` lines as fast as `--rate` says.
Usage: python bench/agent_watch_cost.py [--rounds 3] [--seconds 20] [--rate 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import median  # noqa: E402

RANK = """
import sys, time
rate, seconds, flood = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
n = int(rate * seconds)
t0 = time.monotonic()
for i in range(n + 1):
    if flood:
        sys.stdout.write("step %d/%d loss 0.5\\n" % (i, n))
    else:
        bar = "\\r %3d%%|#####     | %d/%d [00:10<00:12, %.1fit/s]"
        sys.stderr.write(bar % (i * 100 // n, i, n, rate))
    sys.stdout.flush(); sys.stderr.flush()
    time.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
"""
STAND_IN = """#!/bin/sh
# STAND-IN nvidia-smi (bench/agent_watch_cost.py): no GPU on this machine.
echo "0, 87, 40000, 81559"
echo "1, 85, 39000, 81559"
"""


def one(variant: str, seconds: float, rate: float, flood: bool) -> float:
    """The agent's CPU seconds per second for one variant (run in this process)."""
    from trebuchet.runtime.node.agent import Agent, Proc

    tmp = Path(tempfile.mkdtemp(prefix="treb-watch-cost-"))
    adir = tmp / "run" / "attempt-0"
    adir.mkdir(parents=True)
    config: dict = {"ranks": [0]}
    if variant.startswith("gpu"):
        config["gpus"] = 2
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text(STAND_IN)
        (bin_dir / "nvidia-smi").chmod(0o755)
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    (tmp / "run" / "metrics.json").write_text(json.dumps(config))
    (tmp / "rank.py").write_text(RANK)
    argv = [sys.executable, str(tmp / "rank.py"), str(rate), str(seconds), "1" if flood else "0"]
    procs = [Proc(f"rank-{r}", f"0:{r}", argv, {**os.environ, "RANK": str(r)}, r, 0, r)
             for r in range(2)]  # fmt: skip
    agent = Agent(procs, str(adir), str(tmp), 5.0)
    if variant == "base":  # the reader as before: the metrics hook alone, no ETA
        agent.progress.on_line = agent.metrics
    if variant == "gpu-1s" and agent.gpus is not None:
        agent.gpus.every = 1.0
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    code = agent.run()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert code == 0, code
    if variant != "base":
        assert (tmp / "run" / "progress.json").is_file(), "no progress recorded"
    if variant.startswith("gpu"):
        assert (adir / "gpu" / "node-0.json").is_file(), "no GPU sample"
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=10.0, help="lines a second per rank")
    ap.add_argument("--flood", action="store_true", help="`step i/N` lines instead of a bar")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(one(args.one, args.seconds, args.rate, args.flood))
        return
    variants = ["base", "progress", "gpu", "gpu-1s"]
    got: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            argv = [sys.executable, __file__, "--one", v, "--seconds", str(args.seconds),
                    "--rate", str(args.rate)] + (["--flood"] if args.flood else [])  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            got[v].append(float(out.split()[-1]))
    base = median(got["base"])
    what = "step lines" if args.flood else "tqdm updates"
    print(
        f"node agent, 2 ranks, {args.rate:g} {what}/s each, {args.seconds:g}s, "
        f"median of {args.rounds} rounds (CPU s per s of the agent's process)"
    )
    for v in variants:
        m = median(got[v])
        print(
            f"  {v:<9} {m:.5f}  (+{m - base:.5f} over base)  rounds: "
            + ", ".join(f"{x:.5f}" for x in got[v])
        )


if __name__ == "__main__":
    main()
