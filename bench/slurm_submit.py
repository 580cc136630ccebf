"""Slurm figures on the test cluster: submission to all ranks running, and squeue calls.

1. Seconds from the start of `treb run --on slurm --detach` to the moment every rank's
   command is running (2 nodes x 2 ranks), against `sbatch` of an equivalent hand-written
   script (same nodes, tasks and srun step), alternated, medians. A rank's start is the
   time its command writes into a marker file, so no polling delay is counted.
2. squeue calls per poll with 20 active runs: `treb ps` (one poll of every active run)
   with a PATH shim that logs each squeue call and passes it to the real squeue.

Usage (cluster up, SLURM_CONF set; see tests/slurm_cluster/README.md):
    scripts/with-slurm-cluster .venv/bin/python bench/slurm_submit.py [--repeats 7]
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

RANK_CMD = 'date +%s.%N > "$MARKS/$RUN_TAG-$RANK"; sleep 2'
HAND_WRITTEN = """#!/bin/bash
#SBATCH --job-name=hand
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --output={out}/hand-%j.log
srun bash -c 'RANK=$SLURM_PROCID; {cmd}'
"""


def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    res = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stderr[-2000:]}")
    return res.stdout


def wait_marks(marks: Path, tag: str, n: int, timeout: float = 120) -> float:
    """Latest start time written by the n ranks of one job."""
    deadline = time.monotonic() + timeout
    while True:
        files = list(marks.glob(f"{tag}-*"))
        texts = [f.read_text().strip() for f in files]
        if len(files) == n and all(texts):
            return max(float(t) for t in texts)
        if time.monotonic() > deadline:
            raise SystemExit(f"{tag}: ranks not running after {timeout}s")
        time.sleep(0.02)


def wait_idle(env: dict[str, str]) -> None:
    """Until the cluster runs no job (each measurement starts from an idle cluster)."""
    while run(["squeue", "-h", "-o", "%i"], env).strip():
        time.sleep(0.2)


def submit_to_running(work: Path, env: dict[str, str], repeats: int) -> None:
    marks = work / "marks"
    marks.mkdir()
    spec = work / "job.yaml"
    spec.write_text(f"name: bench\ncommand: '{RANK_CMD}'\nnodes: 2\nprocs_per_node: 2\n")
    script = work / "hand.sbatch"
    script.write_text(HAND_WRITTEN.format(out=work, cmd=RANK_CMD.replace("'", "'\\''")))
    env = {**env, "MARKS": str(marks)}
    treb = shutil.which("treb") or "treb"
    cmds = {
        "treb run --on slurm": [treb, "run", str(spec), "--on", "slurm", "--detach"],
        "sbatch hand-written": ["sbatch", "--parsable", str(script)],
    }
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(repeats + 1):  # round 0 warms caches, untimed
        for name, argv in cmds.items():
            tag = f"{i}{'t' if name.startswith('treb') else 's'}"
            wait_idle(env)
            t0 = time.time()
            run(argv, {**env, "RUN_TAG": tag}, cwd=work)
            started = wait_marks(marks, tag, 4)
            if i:
                times[name].append(started - t0)
    wait_idle(env)
    print(f"# submission to all 4 ranks running (2 nodes x 2), {machine()}, "
          f"{repeats} alternating rounds, median (min-max) seconds")  # fmt: skip
    for name, xs in times.items():
        print(f"{name:<22} {median(xs):6.3f}  ({min(xs):.3f}-{max(xs):.3f})")
    ratio = median(times["treb run --on slurm"]) / median(times["sbatch hand-written"])
    print(f"{'ratio treb/sbatch':<22} {ratio:6.2f}")


def squeue_calls(work: Path, env: dict[str, str], runs: int = 20, polls: int = 5) -> None:
    spec = work / "sleep.yaml"
    spec.write_text("name: idle\ncommand: 'sleep 300'\n")
    treb = shutil.which("treb") or "treb"
    ids = [run([treb, "run", str(spec), "--on", "slurm", "--detach"], env, work).strip()
           for _ in range(runs)]  # fmt: skip
    shim = work / "shim"
    shim.mkdir()
    log = work / "squeue.calls"
    real = shutil.which("squeue", path=env["PATH"])
    (shim / "squeue").write_text(f'#!/bin/bash\necho "$*" >> {log}\nexec {real} "$@"\n')
    (shim / "squeue").chmod(0o755)
    shim_env = {**env, "PATH": f"{shim}:{env['PATH']}"}
    try:
        t0 = time.perf_counter()
        for _ in range(polls):
            out = run([treb, "ps"], shim_env)
        elapsed = (time.perf_counter() - t0) / polls
        active = sum(1 for line in out.splitlines() if " RUNNING " in line or " PENDING " in line)
        calls = len(log.read_text().splitlines()) if log.exists() else 0
        print(f"# squeue calls per poll ({polls} x `treb ps`, {active} active slurm runs): "
              f"{calls / polls:.1f}; `treb ps` {elapsed:.3f} s per poll")  # fmt: skip
    finally:
        jobs = [r["backend_id"] for r in json.loads(run([treb, "ps", "--json"], env))
                if r["backend_id"]]  # fmt: skip
        subprocess.run(["scancel", *jobs], env=env, timeout=60)
        for rid in ids:  # records the end of each run (their jobs are already cancelled)
            subprocess.run([treb, "cancel", rid], env=env, capture_output=True, timeout=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        raise SystemExit("needs the test cluster: scripts/with-slurm-cluster python " + __file__)
    with tempfile.TemporaryDirectory(prefix="treb-bench-slurm-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "TREB_HOME": str(work / "home")}
        submit_to_running(work, env, args.repeats)
        squeue_calls(work, env)


if __name__ == "__main__":
    main()
