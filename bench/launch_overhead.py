"""Launch overhead: `treb run` (native launcher) vs torchrun vs a 10-line Popen launcher.

All three start N processes of the same no-op Python script and wait for them; they run in
turn, round after round, and the median wall times are reported with the ratios treb/torchrun
(target: <= 0.10 for 2 ranks) and treb/popen (target: <= 1.2 for 32 ranks). The Popen
launcher, written to the temporary directory, is the least any launcher has to do:

    import os, subprocess, sys

    n, argv = int(sys.argv[1]), sys.argv[2:]
    procs = [
        subprocess.Popen(argv, env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                                    "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n)})
        for r in range(n)
    ]
    sys.exit(max(p.wait() for p in procs))

Child processes write .pyc files (PYTHONDONTWRITEBYTECODE is unset), as on a user's machine.
`treb` runs a spec it has run before (from the spec cache, trebuchet/spec/cache.py: no
pydantic, supervised in the same process); `treb cold` runs it with TREB_SPEC_CACHE=0, as
a spec seen for the first time or changed since (validated, then an exec to the supervisor).
Usage: python bench/launch_overhead.py [--repeats 7] [--ranks 2 32]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, machine, median  # noqa: E402

# The Popen launcher is the one the docstring shows, so the two cannot drift apart.
POPEN = textwrap.dedent(__doc__.split("has to do:\n\n", 1)[1].split("\n\nChild", 1)[0]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 32])
    args = ap.parse_args()
    torchrun = shutil.which("torchrun")
    treb = shutil.which("treb")
    python = shutil.which("python")
    if not torchrun or not treb or not python:
        raise SystemExit("needs torchrun, treb and python on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "noop.py").write_text("pass\n")
        (work / "popen.py").write_text(POPEN)
        env = {**os.environ, "TREB_HOME": str(work / "home")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        print(
            f"# launch overhead, no-op rank script, {machine()}, {args.repeats} alternating rounds"
        )
        print(
            f"{'ranks':>5} {'torchrun s':>11} {'popen s':>8} {'treb s':>8} {'cold s':>7} "
            f"{'treb/torchrun':>13} {'treb/popen':>10} {'cold/torchrun':>13} {'cold/popen':>10}"
        )
        for n in args.ranks:
            spec = work / f"noop{n}.yaml"
            spec.write_text(f"command: [python, noop.py]\nprocs_per_node: {n}\n")
            cmds = {
                "torchrun": [torchrun, "--nproc_per_node", str(n), "noop.py"],
                "popen": [python, "popen.py", str(n), "python", "noop.py"],
                "treb": [treb, "run", str(spec)],
                "cold": ["env", "TREB_SPEC_CACHE=0", treb, "run", str(spec)],
            }
            t = alternate(cmds, args.repeats, env, cwd=str(work))
            tr, tp, tb = median(t["torchrun"]), median(t["popen"]), median(t["treb"])
            tc = median(t["cold"])
            print(f"{n:>5} {tr:>11.3f} {tp:>8.3f} {tb:>8.3f} {tc:>7.3f} {tb / tr:>13.3f} "
                  f"{tb / tp:>10.3f} {tc / tr:>13.3f} {tc / tp:>10.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
