"""Slurm figures at scale on the 8-node test cluster (partition `big`, 8 CPUs per node).

1. A 64-rank TCP ring: `treb run --on slurm` of 8 nodes x 8 ranks (launcher native), each
   rank passing a token to the next one over the network (tests/integration/scripts/ring.py,
   stdlib only). Attached wall time of `treb run` (submission to its return), and from the
   run's record the span from its creation to its end.
2. A 200-point sweep as one job array: `treb run job.yaml --on slurm` of a `sweep:` block,
   1 node x 1 rank, command `true`. Attached wall time of the whole sweep, and from the
   records the span from the first point's creation to the last point's end.

Each measurement starts from an idle cluster; medians (min-max) of --repeats rounds, after
one untimed ring to warm caches. PYTHONDONTWRITEBYTECODE is dropped for the children (.pyc
files present, as users have them).

Usage (cluster up with its `big` partition, SLURM_CONF set; tests/slurm_cluster/README.md):
    scripts/with-slurm-cluster .venv/bin/python bench/slurm_scale.py [--repeats 3]
        [--compare OLD_CHECKOUT]   # e.g. `git archive 9b663a1 | tar -x -C /tmp/old`: the two
                                   # codes alternate within each round
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402

RING = Path(__file__).resolve().parent.parent / "tests" / "integration" / "scripts" / "ring.py"


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stdout[-1000:]}{res.stderr[-2000:]}")
    return res.stdout


def wait_idle(env: dict[str, str]) -> None:
    """Until the cluster runs no job (each measurement starts from an idle cluster)."""
    while run(["squeue", "-h", "-o", "%i"], env).strip():
        time.sleep(0.2)


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    wait_idle(env)
    t0 = time.perf_counter()
    run(argv, env, cwd)
    return time.perf_counter() - t0


def runs(treb: list[str], env: dict[str, str]) -> list[dict]:
    return json.loads(run([*treb, "ps", "--all", "--json"], env))


def report(name: str, walls: list[float], spans: list[float]) -> None:
    for what, xs in (("attached wall", walls), ("records span", spans)):
        print(f"{name:<44} {what:<14} {median(xs):6.2f}  ({min(xs):.2f}-{max(xs):.2f})")


Contenders = dict[str, dict[str, str]]  # label -> environment (PYTHONPATH: whose code)


def ring(work: Path, codes: Contenders, treb: list[str], partition: str, repeats: int) -> None:
    spec = work / "spec" / "ring.yaml"
    spec.write_text(f"name: ring\ncommand: '{sys.executable} {RING}'\nnodes: 8\n"
                    f"procs_per_node: 8\nslurm:\n  partition: {partition}\n")  # fmt: skip
    argv = [*treb, "run", str(spec), "--on", "slurm"]
    got: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in codes}
    for env in codes.values():
        timed(argv, env, work)  # warm-up, untimed
    for _ in range(repeats):
        for label, env in codes.items():  # alternated: noise hits each code alike
            got[label][0].append(timed(argv, env, work))
            rec = max(runs(treb, env), key=lambda r: r["created_at"])
            if rec["state"] != "SUCCEEDED" or rec["shape"] != "8x8":
                raise SystemExit(f"ring run {rec['id']} {rec['state']} ({rec['shape']})")
            got[label][1].append(rec["ended_at"] - rec["created_at"])
    for label, (walls, spans) in got.items():
        report(f"64-rank ring (8 nodes x 8){label}", walls, spans)


def sweep(work: Path, codes: Contenders, treb: list[str], partition: str, repeats: int) -> None:
    spec = work / "spec" / "point.yaml"
    values = ", ".join(str(i) for i in range(1, 201))  # a sweep: block, as every version reads
    spec.write_text(f"name: point\ncommand: 'true'\nslurm:\n  partition: {partition}\n"
                    f"sweep:\n  env.X: [{values}]\n")  # fmt: skip
    got: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in codes}
    for i in range(repeats):
        for n, (label, env) in enumerate(codes.items()):
            home = work / f"home-sweep-{i}-{n}"  # one store per sweep: its runs are its points
            senv = {**env, "TREB_HOME": str(home)}
            argv = [*treb, "run", str(spec), "--on", "slurm"]
            got[label][0].append(timed(argv, senv, work))
            recs = runs(treb, senv)
            ok = sum(r["state"] == "SUCCEEDED" for r in recs)
            if ok != 200 or len({r["sweep_id"] for r in recs}) != 1:
                raise SystemExit(f"sweep: {ok} of {len(recs)} points succeeded")
            got[label][1].append(
                max(r["ended_at"] for r in recs) - min(r["created_at"] for r in recs)
            )
    for label, (walls, spans) in got.items():
        report(f"200-point sweep (one job array){label}", walls, spans)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--partition", default="big", help="8 nodes x >= 8 CPUs (default big)")
    ap.add_argument(
        "--compare", type=Path, help="another checkout's code, alternated with this one"
    )
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        raise SystemExit("needs the test cluster: scripts/with-slurm-cluster python " + __file__)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    nodes = run(["sinfo", "-h", "-p", args.partition, "-o", "%D %c"], env).split()
    if len(nodes) < 2 or int(nodes[0]) < 8 or int(nodes[1]) < 8:
        raise SystemExit(f"partition {args.partition!r} needs 8 nodes x 8 CPUs, has {nodes}")
    treb = [sys.executable, "-m", "trebuchet"]
    with tempfile.TemporaryDirectory(prefix="treb-bench-scale-") as tmp:
        work = Path(tmp)
        # The specs alone in their folder: it is the workdir each run snapshots.
        (work / "spec").mkdir()
        env["TREB_HOME"] = str(work / "home")
        here = str(Path(__file__).resolve().parent.parent)
        codes = {"": {**env, "PYTHONPATH": here}}
        if args.compare:
            other = {**env, "PYTHONPATH": str(args.compare.resolve())}
            codes = {" [this code]": codes[""], f" [{args.compare.name}]": other}
        print(f"# treb run --on slurm at scale, partition {args.partition}, {machine()}, "
              f"{args.repeats} rounds, median (min-max) seconds")  # fmt: skip
        ring(work, codes, treb, args.partition, args.repeats)
        sweep(work, codes, treb, args.partition, args.repeats)


if __name__ == "__main__":
    main()
