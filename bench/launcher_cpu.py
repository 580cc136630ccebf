"""What the launcher's own process costs beside training ranks: CPU time, not samples/s.

The samples/s of a 2-core shared machine vary by 10-20% from run to run, so a cost of under
1% cannot be seen in them (bench/train_speed.py). CPU time can: this runs
examples/digits-ddp (2 ranks, attached, its output read and discarded as a terminal would)
with progress tracking and a hang watch on (`hang_timeout`), samples the supervisor's own
CPU time (utime + stime in /proc/PID/stat: `treb run` becomes the supervisor, same pid)
twice a second, and reports, for it, for it with no metrics read (`-o metrics.ranks=[]`:
what reading metrics costs is the difference) and, alternately, for torchrun's agent on the
same script (`torchrun --standalone --nproc_per_node 2`, same OMP_NUM_THREADS, checkpoints):
  - the launcher's CPU during training, in % of one core, from the first sample after
    `--settle` seconds to the last one before it exits (start-up and the end left out);
  - the ranks' CPU (the run's children, from wait4's rusage, less the supervisor's own);
  - their ratio: the share of the machine the launcher takes from the ranks, at most.
The supervisor's figure includes everything it does (supervision, the live view, the
progress reader, the hang watch, metrics), so the tracking alone costs no more than it.
Usage: python bench/launcher_cpu.py [--rounds 3] [--epochs 300] [--settle 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "digits-ddp"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of one process (all its threads), or None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def one_run(argv: list[str], cwd: Path, env: dict[str, str], settle: float) -> dict[str, float]:
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None
    drain = threading.Thread(target=proc.stdout.read, daemon=True)
    drain.start()
    t0 = time.monotonic()
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None
    while True:
        cpu = cpu_seconds(proc.pid)
        now = time.monotonic()
        if cpu is None:
            break
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":  # exited, not yet reaped: its figures are final
            break
        if now - t0 >= settle:
            if first is None:
                first = (now, cpu)
            last = (now, cpu)
        time.sleep(0.5)
    _, status, usage = os.wait4(proc.pid, 0)
    drain.join(5)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[0]} failed ({os.waitstatus_to_exitcode(status)})")
    if first is None or last is None or last[0] - first[0] < 5:
        raise SystemExit("the run was too short to measure: raise --epochs")
    # wait4: the supervisor and the children it waited for (ranks, watchdog); its own
    # share is its last sample (at most half a second before it exited)
    children = usage.ru_utime + usage.ru_stime - last[1]
    wall = time.monotonic() - t0
    sup_rate = (last[1] - first[1]) / (last[0] - first[0])
    return {"sup_rate": sup_rate, "sup_total": last[1], "ranks_rate": children / wall,
            "ratio": sup_rate / (children / wall), "wall": wall}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--settle", type=float, default=5.0)
    args = ap.parse_args()
    treb, torchrun = shutil.which("treb"), shutil.which("torchrun")
    if not treb or not torchrun:
        raise SystemExit("needs treb and torchrun on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copy(EXAMPLE / "train.py", work / "train.py")
        spec = work / "job.yaml"
        spec.write_text(
            f"command: [python, train.py, --epochs, '{args.epochs}']\nprocs_per_node: 2\n"
            "hang_timeout: 10m\n"
        )
        env = {**os.environ, "TREB_HOME": str(work / "home")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        threads = str(max(1, len(os.sched_getaffinity(0)) // 2))  # what treb gives each rank
        cmds = {
            "treb": [treb, "run", str(spec)],
            "treb-no-metrics": [treb, "run", str(spec), "-o", "metrics.ranks=[]"],
            "torchrun": [torchrun, "--standalone", "--nproc_per_node", "2", "train.py",
                         "--epochs", str(args.epochs)],
        }  # fmt: skip
        print(f"# launcher CPU beside digits-ddp (2 ranks; treb attached), {machine()}")
        print(f"{'round':>5} {'launcher':>15} {'wall s':>7} {'launcher %core':>14} "
              f"{'ranks %core':>12} {'ratio %':>8} {'launcher CPU s (all)':>20}")  # fmt: skip
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in cmds}
        for i in range(args.rounds):
            for name, argv in cmds.items():
                run_env = {**env, "OMP_NUM_THREADS": threads}
                if name == "torchrun":  # the same per-epoch checkpoint as treb's ranks write
                    run_env["TREB_CHECKPOINT_DIR"] = tempfile.mkdtemp(dir=work)
                r = one_run(argv, work, run_env, args.settle)
                rows[name].append(r)
                print(f"{i + 1:>5} {name:>15} {r['wall']:>7.1f} {100 * r['sup_rate']:>14.3f} "
                      f"{100 * r['ranks_rate']:>12.1f} {100 * r['ratio']:>8.3f} "
                      f"{r['sup_total']:>20.2f}")  # fmt: skip
        for name, got in rows.items():
            ratio = 100 * median([r["ratio"] for r in got])
            rate = 100 * median([r["sup_rate"] for r in got])
            print(f"{name}: median {rate:.3f}% of a core, {ratio:.3f}% of the ranks' CPU")


if __name__ == "__main__":
    main()
