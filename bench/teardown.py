"""Teardown latency: from the first rank's death to the last rank's death.

One rank exits 1 after a second; the others sleep. The failing rank stamps the time just
before it exits; the last death is the latest end time in the outcome records. Median of
`--repeats` runs for each rank count. Also counts processes of each run left alive
afterwards (found by TREB_RUN_ID in the process table): must be 0.
Usage: python bench/teardown.py [--repeats 10] [--ranks 2 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAIL = (
    'if [ "$RANK" = 0 ]; then sleep 1; date +%s.%N > "$TREB_RUN_DIR/died"; exit 1; fi; '
    "exec sleep 300"
)


def survivors(run_id: str) -> int:
    needle = f"TREB_RUN_ID={run_id}".encode()
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if needle in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    count += 1
            except OSError:
                pass
    return count


def one(treb: str, spec: Path, env: dict[str, str]) -> tuple[float, int]:
    subprocess.run([treb, "run", str(spec)], env=env, capture_output=True, check=False)
    st = json.loads(subprocess.run([treb, "status", "--json"], env=env, capture_output=True).stdout)
    run_dir = Path(st["run_dir"])
    first = float((run_dir / "died").read_text())
    last = max(p["ended_at"] for p in st["procs"])
    time.sleep(0.2)
    return last - first, survivors(st["id"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 16])
    args = ap.parse_args()
    treb = shutil.which("treb") or sys.exit("needs treb on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TREB_HOME": str(Path(tmp) / "home")}
        print(f"# teardown: first rank death -> last rank death, median of {args.repeats}")
        print(f"{'ranks':>5} {'median ms':>10} {'max ms':>8} {'orphans':>8}")
        for n in args.ranks:
            spec = Path(tmp) / f"fail{n}.yaml"
            spec.write_text(f"command: '{FAIL}'\nprocs_per_node: {n}\n")
            results = [one(treb, spec, env) for _ in range(args.repeats)]
            lat = [r[0] * 1000 for r in results]
            orphans = sum(r[1] for r in results)
            print(f"{n:>5} {statistics.median(lat):>10.1f} {max(lat):>8.1f} {orphans:>8}")


if __name__ == "__main__":
    main()
