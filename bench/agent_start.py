"""One Slurm node agent's start, in CPU: what each of a step's agents pays before its first
rank starts (issue 36: at 64 nodes on this machine's 2 cores, 64 of them were ~1 s of a
launch's +2.96 s over srun, and a node death's restart starts 64 again).

Why without Slurm: the cost is the agent's own (an interpreter, the archive's imports, its
node's checks, its link to the controller); the test cluster's namespaces and slurmstepd
add noise, not the figure. Each start is the real `python3 -S <run>/treb-runtime-*.pyz task
job.json` path in a fresh process, with what the step's environment gives it: a native job
of `--procs` ranks on the node (one agent per node), a real controller link (the Hub of
runtime/job/link.py in this process) that answers its `health` with `go` (SLURM_NNODES=2:
the barrier waits for the word, as on a cluster), its node's health checks on the run dir.
An audit hook ends the agent (os._exit) the moment it asks for its first rank's Popen: the
figure is its user+sys CPU up to there (os.wait4's rusage of that child alone), not the
rank's. The hook's process runs the archive as `python3 -S archive.pyz` does (its path
first on sys.path, then runpy's __main__ of it).

Several `--archive` files (say one built before a change and one after) are alternated
start by start, so the machine's load hits them alike; with none, the archive of the
sources beside this file is built and measured. `--modules FILE` also writes the modules
the agent had imported at its first rank's start (one untimed start of the first archive).
Usage: python bench/agent_start.py [--starts 25] [--procs 8] [--archive A.pyz ...]
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import machine, median  # noqa: E402

MARK = "treb-bench-first-rank"  # the rank's last argument: the hook knows its Popen by it
PROBE = """
import os, sys
archive, mark, out = sys.argv[1], sys.argv[3], os.environ.get("TREB_BENCH_MODULES")

def hook(event, args):
    if event == "subprocess.Popen" and mark in [str(a) for a in args[1]]:
        if out:
            with open(out, "w") as fh:
                fh.write("\\n".join(sorted(sys.modules)))
        os._exit(0)

sys.addaudithook(hook)
sys.argv = [archive, "task", sys.argv[2]]
sys.path.insert(0, archive)
import runpy
runpy._run_module_as_main("__main__", False)  # as python3 runs a zip
"""


def build_current(home: Path) -> Path:
    """The archive of the sources beside this file (launcher/runtime_file.py's build)."""
    os.environ["TREB_HOME"] = str(home)
    from trebuchet.launcher import runtime_file

    path = runtime_file.cached_path()
    if path is None:
        raise SystemExit(f"cannot build the runtime archive in {home}")
    return path


def setup(root: Path, archive: Path, procs: int) -> tuple[Path, Path, dict[str, str]]:
    """A run directory as the controller leaves it before its step: the archive, job.json,
    attempt-0/attempt.json (read by the `shared` check). Its run dir, job file, env."""
    run = root / f"run-{archive.stem}"
    (run / "attempt-0").mkdir(parents=True)
    (run / "attempt-0" / "attempt.json").write_text(json.dumps({"job_id": "77", "attempt": 0}))
    shipped = run / archive.name
    shutil.copyfile(archive, shipped)
    job = {
        "run_id": "bench", "run_dir": str(run), "workdir": str(root), "launcher": "native",
        "nodes": 2, "ppn": procs, "grace": 2, "checkpoint_signal": "SIGUSR1",
        "command": ["/bin/true", MARK], "mpi_env": [], "srun": ["--ntasks-per-node=1"],
        "max_attempts": 1,
    }  # fmt: skip
    job_path = run / "job.json"
    job_path.write_text(json.dumps(job))
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(root), "TREB_RUN_DIR": str(run),
        "TREB_WORKDIR": str(root), "TREB_RUN_ID": "bench", "TREB_ATTEMPT": "0",
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "tn[1-2]", "SLURMD_NODENAME": "tn1", "SLURM_CPUS_ON_NODE": "8",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "TREB_AGENT_PARK": "1",  # a step the controller keeps: the barrier's word on the link
    }  # fmt: skip
    return shipped, job_path, env


def start_cpu(python: str, shipped: Path, job: Path, env: dict[str, str], hub: object,
              modules: Path | None = None) -> float:  # fmt: skip
    """One agent's start: user+sys CPU seconds of its process up to its first rank's Popen."""
    hub.expect(0, 1)  # type: ignore[attr-defined]  # one agent; its `health` gets the go
    env = {**env, "TREB_CONTROLLER_LINK": hub.address("127.0.0.1")}  # type: ignore[attr-defined]
    if modules is not None:
        env["TREB_BENCH_MODULES"] = str(modules)
    argv = [python, "-S", "-c", PROBE, str(shipped), str(job), MARK]
    proc = subprocess.Popen(argv, env=env, cwd=str(shipped.parent), stderr=subprocess.PIPE)
    end = time.monotonic() + 60
    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    while pid == 0:  # polled: an agent that never reaches its rank is named, not waited on
        if time.monotonic() > end:
            proc.kill()
            raise SystemExit("the agent did not start its rank within 60 s")
        time.sleep(0.005)
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:  # the hook ends it with 0 at the rank's Popen, no earlier
        raise SystemExit(f"the agent ended with {proc.returncode} before its rank: {err[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=25, help="starts per archive (median)")
    ap.add_argument("--procs", type=int, default=8, help="ranks on the agent's node")
    ap.add_argument("--archive", action="append", default=[], help="a treb-runtime-*.pyz")
    ap.add_argument("--python", default=sys.executable, help="the nodes' python3")
    ap.add_argument("--modules", type=Path, help="write the first archive's modules here")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object")
    args = ap.parse_args()
    from trebuchet.runtime.job.link import Hub

    with tempfile.TemporaryDirectory(prefix="treb-agent-start-") as tmp:
        root = Path(tmp)
        archives = [Path(a).resolve() for a in args.archive] or [build_current(root / "home")]
        runs = {str(a): setup(root, a, args.procs) for a in archives}
        rfd, wfd = os.pipe()
        hub = Hub(wfd)
        try:
            if args.modules is not None:
                start_cpu(args.python, *runs[str(archives[0])], hub, modules=args.modules)
            for shipped, job, env in runs.values():  # warm the page cache once, untimed
                start_cpu(args.python, shipped, job, env, hub)
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(args.starts):
                for name, (shipped, job, env) in runs.items():
                    cpu[name].append(start_cpu(args.python, shipped, job, env, hub))
        finally:
            hub.close()
            os.close(rfd)
            os.close(wfd)
    load = os.getloadavg()
    figures = {
        Path(name).name: {"median_ms": round(median(xs) * 1000, 1),
                          "min_ms": round(min(xs) * 1000, 1), "max_ms": round(max(xs) * 1000, 1),
                          "starts": len(xs)}
        for name, xs in cpu.items()
    }  # fmt: skip
    if args.json:
        print(json.dumps({"python": args.python, "procs": args.procs, "load": load,
                          "agents": figures}))  # fmt: skip
        return 0
    print(f"# one node agent's start, CPU up to its first rank's Popen ({machine()};")
    print(f"# {args.python} -S; {args.procs} ranks; load after {load[0]:.2f} {load[1]:.2f})")
    for name, fig in figures.items():
        print(f"{name}: median {fig['median_ms']} ms (min {fig['min_ms']}, max "
              f"{fig['max_ms']}, {fig['starts']} starts)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
