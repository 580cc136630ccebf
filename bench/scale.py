"""treb's own costs as the node count grows (issue 36), on the local engine or the Slurm
test cluster, with ranks that cost almost nothing (bench/tiny_rank.sh).

For each node count N (x P ranks per node), one run of `treb run --detach` with
`retries: 1`:
  launch   submission -> every rank of attempt 0 running (the last readiness stamp)
  cpu to launch  the CPU seconds the supervisor (local), the controller and one node agent
           (Slurm, the mean of the agents) had spent once every rank ran
  steady   the supervisor's (local) or job controller's (Slurm) CPU share and resident memory
           over --steady seconds of a run whose ranks only sleep; on Slurm also the node
           agents' (the largest RSS and the mean CPU of one)
  views    wall seconds of `treb status`, `ps`, `logs --tail`, `logs --dedup`, `diagnose`
           and `top --once` over the run's N x P rank logs, each once, the run live
  retry    one rank told to fail (SIGUSR1) -> every rank of attempt 1 running; the CPU
           the controller and the node agents (Slurm: all of them, in all) or the
           supervisor (local) spent in it, and the whole machine's busy CPU
  rundir   bytes and files the run wrote to its run directory (after its cancel)
On Slurm (--on slurm) --rounds treb launches (the first one the full round above, the
others launch only) alternate with as many plain `sbatch --wrap "srun ..."` of the same
shape starting the same program (submission -> every rank running); medians.
Then a fitted line (least squares, figure = a + b x nodes) per figure.

Usage:
    python bench/scale.py --on local [--nodes 16,32,64,128] [--procs 4] [--steady 60]
    TREB_SLURM_NODES=64 scripts/with-slurm-cluster python bench/scale.py --on slurm \\
        --nodes 64 --procs 8 [--steady 30]     # N <= the cluster's nodes, partition big
Prints a table; --json FILE also writes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, wait  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "bench" / "tiny_rank.sh"
TREB = [sys.executable, "-m", "trebuchet"]
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
VIEWS = {
    "status": ["status", "{run}"],
    "ps": ["ps", "--all"],
    "logs --tail": ["logs", "{run}", "--tail", "20"],
    "logs --dedup": ["logs", "{run}", "--dedup"],
    "diagnose": ["diagnose", "{run}"],
    "top --once": ["top", "--once"],
}


def sh(argv: list[str], env: dict[str, str], timeout: float = 600) -> str:
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {res.stdout[-800:]}{res.stderr[-1500:]}")
    return res.stdout


def stamps(d: Path, attempt: int) -> dict[int, tuple[float, int]]:
    """rank -> (ready time, pid) of one attempt."""
    out = {}
    for p in d.glob(f"{attempt}-*"):
        if p.name.endswith(".tmp"):
            continue
        with contextlib.suppress(ValueError, OSError):
            t, pid = p.read_text().split()
            out[int(p.name.split("-")[1])] = (float(t), int(pid))
    return out


def proc_times(pid: int) -> tuple[float, int]:
    """(CPU seconds, RSS bytes) of one process."""
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK, int(f[21]) * PAGE


def cpu_of(pids: list[int]) -> float:
    """The CPU seconds the live ones of `pids` have spent, in all."""
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            total += proc_times(p)[0]
    return total


def busy_cpu() -> float:
    """The machine's CPU seconds not idle (nor waiting for I/O) since boot, all cores."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / CLK


def procs_matching(words: list[str]) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if all(w in cmd for w in words):
                out.append(int(p.name))
    return out


def steady(pids: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """CPU % of one core and max RSS MiB per group over `seconds` (for agents: per process)."""
    before = {g: {p: proc_times(p)[0] for p in ps} for g, ps in pids.items()}
    t0 = time.monotonic()
    rss: dict[str, float] = {g: 0.0 for g in pids}
    while time.monotonic() - t0 < seconds:
        for g, ps in pids.items():
            for p in ps:
                with contextlib.suppress(OSError):
                    rss[g] = max(rss[g], proc_times(p)[1] / 2**20)
        time.sleep(1.0)
    wall = time.monotonic() - t0
    out = {}
    for g, ps in pids.items():
        cpu = []
        for p in ps:
            with contextlib.suppress(OSError):
                cpu.append(proc_times(p)[0] - before[g][p])
        out[f"{g} cpu %"] = 100 * statistics.mean(cpu) / wall if cpu else float("nan")
        out[f"{g} rss MiB"] = rss[g]
    return out


def spec_text(on: str, nodes: int, procs: int, st: Path, partition: str) -> str:
    text = (f"name: scale-{nodes}\ncommand: bash {TINY}\nnodes: {nodes}\n"
            f"procs_per_node: {procs}\nretries: 1\nsnapshot: false\n"
            f"env: {{STAMPS: {json.dumps(str(st))}}}\n")  # fmt: skip
    if on == "slurm":
        text += f"slurm:\n  partition: {partition}\n"
    return text


def dir_size(d: Path) -> tuple[int, int]:
    size = files = 0
    for p in d.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink():
                size += p.stat().st_size
                files += 1
    return size, files


def treb_round(
    work: Path, env: dict[str, str], args: argparse.Namespace, n: int, full: bool = True
) -> dict:
    """One run: its launch, and when `full` the steady run, the views, a retry, its files."""
    st = work / f"st-{n}-{time.time_ns()}"
    st.mkdir()
    spec = work / "spec" / "job.yaml"
    spec.write_text(spec_text(args.on, n, args.procs, st, args.partition))
    world = n * args.procs
    t0 = time.time()
    sh([*TREB, "run", str(spec), "--on", args.on, "--detach"], env)
    rec = max(json.loads(sh([*TREB, "ps", "--all", "--json"], env)),
              key=lambda r: r["created_at"])  # fmt: skip
    run = rec["id"]
    wait(lambda: len(stamps(st, 0)) == world, 600, f"{world} ranks of attempt 0")
    got: dict = {"launch s": max(t for t, _ in stamps(st, 0).values()) - t0}
    run_dir = Path(env["TREB_HOME"]) / "runs" / run
    if not full:
        sh([*TREB, "cancel", run], env)
        wait(lambda: '"run_ended"' in (run_dir / "events.jsonl").read_text(), 300, "the cancel")
        return got
    # Steady: whose CPU and memory
    if args.on == "local":
        groups = {"supervisor": [int(rec["supervisor_pid"])]}
    else:
        groups = {
            "controller": procs_matching([str(Path(env["TREB_HOME"])), " controller "]),
            "agent": procs_matching([str(Path(env["TREB_HOME"])), " task "]),
        }
    for g, ps in groups.items():  # CPU spent up to all ranks running (its start's cost)
        cpu = [proc_times(p)[0] for p in ps if os.path.exists(f"/proc/{p}")]
        got[f"{g} cpu to launch s"] = statistics.mean(cpu) if cpu else float("nan")
        got[f"{g} processes"] = len(ps)
    got |= steady(groups, args.steady)
    for name, argv in VIEWS.items():
        argv = [a.format(run=run) for a in argv]
        t1 = time.perf_counter()
        res = subprocess.run([*TREB, *argv], env=env, capture_output=True, timeout=300)
        got[f"{name} s"] = time.perf_counter() - t1
        if res.returncode not in (0, 1):  # diagnose of a live run may exit 1
            raise SystemExit(f"treb {' '.join(argv)}: {res.returncode} {res.stderr[-800:]!r}")
    # A rank's failure -> every rank of the retry running.
    _, pid = stamps(st, 0)[world // 2 + 1]
    spent = {g: cpu_of(ps) for g, ps in groups.items()}
    busy = busy_cpu()
    t1 = time.time()
    os.kill(pid, 10)  # SIGUSR1: the rank exits 1
    wait(lambda: len(stamps(st, 1)) == world, 600, f"{world} ranks of attempt 1")
    got["retry s"] = max(t for t, _ in stamps(st, 1).values()) - t1
    # whose CPU the retry took (up to the poll that saw its last rank: a little after)
    for g, ps in groups.items():  # Slurm: the parked agents run it (the same processes)
        got[f"{g}s cpu in retry s"] = cpu_of(ps) - spent[g]
    got["machine busy cpu in retry s"] = busy_cpu() - busy
    sh([*TREB, "cancel", run], env)
    wait(lambda: '"run_ended"' in (run_dir / "events.jsonl").read_text(), 300, "the cancel")
    size, files = dir_size(run_dir)
    got["rundir MB"] = size / 1e6
    got["rundir files"] = files
    return got


def srun_round(work: Path, env: dict[str, str], args: argparse.Namespace, n: int) -> float:
    """Submission of `sbatch --wrap "srun tiny"` of the same shape -> every rank running."""
    st = work / f"srun-{n}-{time.time_ns()}"
    st.mkdir()
    world = n * args.procs
    t0 = time.time()
    out = sh(["sbatch", "--parsable", "-p", args.partition, "-N", str(n),
              f"--ntasks-per-node={args.procs}", "-o", str(work / "srun-%j.out"),
              f"--export=ALL,STAMPS={st}", "--wrap", f"srun bash {TINY}"], env)  # fmt: skip
    job = out.strip().split(";")[0]
    try:
        wait(lambda: len(stamps(st, 0)) == world, 600, f"srun's {world} ranks")
        return max(t for t, _ in stamps(st, 0).values()) - t0
    finally:
        sh(["scancel", job], env)
        wait(lambda: not sh(["squeue", "-h", "-j", job], env).strip(), 120, "scancel")


def fit(xs: list[float], ys: list[float]) -> str:
    if len(xs) < 2:
        return ""
    b = statistics.linear_regression(xs, ys)
    return f"{b.intercept:.3g} + {b.slope:.3g} x nodes"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on", choices=["local", "slurm"], default="local")
    ap.add_argument("--nodes", default="16,32,64,128", help="comma-separated node counts")
    ap.add_argument("--procs", type=int, default=4, help="ranks per node")
    ap.add_argument("--steady", type=float, default=60.0, help="seconds of steady run")
    ap.add_argument("--rounds", type=int, default=3, help="Slurm: launches (treb and srun, "
                    "alternated) per size; medians")  # fmt: skip
    ap.add_argument("--partition", default="big")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    sizes = [int(x) for x in args.nodes.split(",")]
    if args.on == "slurm" and (not os.environ.get("SLURM_CONF") or not shutil.which("sbatch")):
        raise SystemExit("needs the test cluster: scripts/with-slurm-cluster python " + __file__)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    rows: dict[int, dict] = {}
    rounds: dict[int, dict[str, list[float]]] = {}  # Slurm: every launch, treb's and srun's
    with tempfile.TemporaryDirectory(prefix="treb-bench-scale-") as tmp:
        work = Path(tmp)
        (work / "spec").mkdir()
        env["TREB_HOME"] = str(work / "home")
        for n in sizes:
            if args.on == "slurm":  # alternated: srun, treb, srun, treb (launch only), ...
                srun: list[float] = []
                launches: list[float] = []
                row = {}
                for i in range(args.rounds):
                    srun.append(srun_round(work, env, args, n))
                    got = treb_round(work, env, args, n, full=i == 0)
                    launches.append(got["launch s"])
                    row = row or got
                row["launch s"] = statistics.median(launches)
                row["srun launch s"] = statistics.median(srun)
                row["treb - srun s"] = row["launch s"] - row["srun launch s"]
                rounds[n] = {"treb": launches, "srun": srun}  # each round's, in --json
            else:
                row = treb_round(work, env, args, n)
            rows[n] = row
            print(f"{n} nodes x {args.procs}: " + ", ".join(
                f"{k} {v:.3g}" for k, v in row.items()), flush=True)  # fmt: skip
    print(f"\n# treb at scale, --on {args.on}, {args.procs} ranks/node, steady "
          f"{args.steady:g}s, {machine()}")  # fmt: skip
    keys = list(next(iter(rows.values())))
    print("| figure | " + " | ".join(f"{n} nodes" for n in rows) + " | fit |")
    print("|---|" + "---|" * (len(rows) + 1))
    for k in keys:
        vals = [rows[n][k] for n in rows]
        print(f"| {k} | " + " | ".join(f"{v:.3g}" for v in vals) + f" | {fit(sizes, vals)} |")
    if args.json:
        args.json.write_text(
            json.dumps({"on": args.on, "procs": args.procs, "rows": rows, "rounds": rounds})
        )


if __name__ == "__main__":
    main()
