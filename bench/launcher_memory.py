"""Resident memory of the launcher's own processes on the submitting machine, local 2-rank run.

Sums VmRSS of every process that is trebuchet's (the `treb run` process and what it started
that runs trebuchet code: the watchdog, a detached supervisor) while two ranks sleep, and of
torchrun's own process for the same two ranks. Ranks are excluded on both sides.
Usage: python bench/launcher_memory.py [--repeats 5]  (target: treb <= 26 MiB)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402

SLEEP_S = 4.0


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """Every process below `root` (by parent pid), found in /proc."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    parents[int(name)] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        out += kids
        todo += kids
    return out


def launcher_rss(argv: list[str], env: dict[str, str], cwd: str, mine: str) -> float:
    """MiB of the launcher's processes (those whose command line contains `mine`, plus the
    started process itself), measured while the ranks sleep. Processes that left the tree
    (the watchdog starts its own session but stays a child) are found by parentage."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(SLEEP_S / 2)
    pids = [proc.pid] + [p for p in descendants(proc.pid) if mine in cmdline(p)]
    total = sum(rss_kib(p) for p in set(pids))
    if proc.wait(timeout=60) != 0:
        raise SystemExit(f"{argv} failed")
    return total / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    treb, torchrun = shutil.which("treb"), shutil.which("torchrun")
    if not treb or not torchrun:
        raise SystemExit("needs treb and torchrun on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "sleep.py").write_text(f"import time\ntime.sleep({SLEEP_S})\n")
        (work / "job.yaml").write_text("command: [python, sleep.py]\nprocs_per_node: 2\n")
        env["TREB_HOME"] = str(work / "home")
        cmds = {
            "treb run (attached)": ([treb, "run", "job.yaml"], "trebuchet"),
            "torchrun": (
                [torchrun, "--nproc_per_node", "2", "--no-python", "python", "sleep.py"],
                "torchrun",
            ),  # fmt: skip
        }
        got: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.repeats):
            for name, (argv, mine) in cmds.items():
                got[name].append(launcher_rss(argv, env, str(work), mine))
    print(f"# launcher resident memory, 2 sleeping ranks, {machine()}, {args.repeats} rounds")
    for name, values in got.items():
        print(f"{name:>22}: median {median(values):6.1f} MiB  (max {max(values):.1f})")


if __name__ == "__main__":
    main()
