"""Launch overhead: `treb run` (native launcher) vs `torchrun --nproc_per_node` on a no-op script.

Both start N processes of the same no-op Python script and wait for them; run alternately,
median wall time reported with the ratio treb/torchrun (target: <= 0.25 for 2 ranks).
Usage: python bench/launch_overhead.py [--repeats 7] [--ranks 2 32]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, machine, median  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 32])
    args = ap.parse_args()
    torchrun = shutil.which("torchrun")
    treb = shutil.which("treb")
    if not torchrun or not treb:
        raise SystemExit("needs torchrun and treb on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text("pass\n")
        env = {**os.environ, "TREB_HOME": str(work / "home")}
        print(
            f"# launch overhead, no-op rank script, {machine()}, {args.repeats} alternating rounds"
        )
        print(f"{'ranks':>5} {'torchrun s':>11} {'treb s':>8} {'ratio':>6}")
        for n in args.ranks:
            spec = work / f"noop{n}.yaml"
            spec.write_text(f"command: [python, noop.py]\nprocs_per_node: {n}\n")
            cmds = {
                "torchrun": [torchrun, "--nproc_per_node", str(n), "noop.py"],
                "treb": [treb, "run", str(spec)],
            }
            t = alternate(cmds, args.repeats, env, cwd=str(work))
            tr, tb = median(t["torchrun"]), median(t["treb"])
            print(f"{n:>5} {tr:>11.3f} {tb:>8.3f} {tb / tr:>6.3f}")


if __name__ == "__main__":
    main()
