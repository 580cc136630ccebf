"""The job controller's two clocks on an engine (runtime/job/life.py), from the run's own
records, as a user would read them:

- retry: a rank of attempt 0 exits 3 (2 nodes x 2 ranks, `retries: 1`); seconds from its
  record's `ended_at` to the retry's ranks' `started_at` (the first and the last of them).
  Targets: <= 0.1 s locally, <= 0.3 s in a Slurm allocation.
- timeout: `timeout: 4s` under a rank that sleeps 60 s; the attempt's start to its end in
  `treb status --json`. Target: TIMEOUT within 1 s of 4 s on every engine.

Usage: python bench/controller_latency.py [--on local|slurm|ssh] [--repeats 5] [--nodes 1]
(Slurm: inside scripts/with-slurm-cluster; each run is an attached `treb run`.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

FAIL_ONCE = '\'if [ "$TREB_ATTEMPT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi; sleep 1\''


def run(spec_text: str, on: str) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="treb-bench-"))
    spec = folder / "job.yaml"
    spec.write_text(spec_text)
    subprocess.run(["treb", "run", str(spec), "--on", on], capture_output=True)
    res = subprocess.run(["treb", "status", "--json"], capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def records(run_dir: Path, attempt: int) -> list[dict]:
    return [json.loads(p.read_text()) for p in (run_dir / f"attempt-{attempt}").glob("rank-*.json")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--on", default="local")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=1, help="nodes of the timeout case")
    args = ap.parse_args()
    first, last, spans = [], [], []
    for _ in range(args.repeats):
        st = run(f"name: retry\nnodes: 2\nprocs_per_node: 2\nretries: 1\ncommand: {FAIL_ONCE}\n",
                 args.on)  # fmt: skip
        assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"], st["attempts"]
        run_dir = Path(st["run_dir"])
        failed = next(r for r in records(run_dir, 0) if r.get("exit_code") == 3)["ended_at"]
        starts = [r["started_at"] for r in records(run_dir, 1)]
        first.append(min(starts) - failed)
        last.append(max(starts) - failed)
        st = run(f"name: timeout\nnodes: {args.nodes}\ncommand: 'sleep 60'\ntimeout: 4s\n",
                 args.on)  # fmt: skip
        attempt = st["attempts"][0]
        assert (st["state"], attempt["reason"]) == ("TIMEOUT", "timeout"), st
        spans.append(attempt["ended_at"] - attempt["started_at"])
    med = statistics.median
    print(f"# {args.on}, {args.repeats} runs each")
    print(f"retry: failure -> first rank of the retry started: median {med(first):.3f} s, "
          f"last: median {med(last):.3f} s (max {max(last):.3f})")  # fmt: skip
    print(f"timeout 4s ({args.nodes} node(s)): attempt span median {med(spans):.2f} s "
          f"(min {min(spans):.2f}, max {max(spans):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
