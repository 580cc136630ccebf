"""Training speed: examples/digits-ddp samples/s under `treb run` (attached, detached) vs torchrun.

Each round runs the same train.py three ways, one after another (the order rotates by one mode
every round, so no mode always follows the same neighbour), after one untimed warm-up round:
  treb-attached  `treb run job.yaml`, its output to a pseudo-terminal (or a pipe, `--sink pipe`)
                 that this script reads and discards, as a terminal would;
  treb-detached  `treb run --detach job.yaml`, then wait for its supervisor process to exit
                 (watched in /proc, which costs nothing, instead of polling `treb status` while
                 the ranks train) and confirm the end state with `treb status --json RUN`;
  torchrun       `torchrun --standalone --nproc_per_node 2 train.py` with the same arguments
                 (--standalone: a free rendezvous port instead of the fixed 29500).
The figure is train.py's own `performance: N samples_per_second` (training samples of all ranks
over the slowest rank's training-loop time; imports and rendezvous are not in it), read with
`treb results --json RUN` for treb and from torchrun's output. What differs between the modes
is only what the launcher does beside the ranks while they train.
Fairness: OMP_NUM_THREADS is set to the same value for all three (by default what treb would
pick: usable CPUs // 2 ranks), PYTHONUNBUFFERED=1 for all (treb sets it for its ranks), and
torchrun's ranks get a fresh TREB_CHECKPOINT_DIR each run, so they write the same per-epoch
checkpoint that treb's ranks do. Child processes write .pyc files (PYTHONDONTWRITEBYTECODE is
unset). `--src DIR` measures another checkout's trebuchet (e.g. the code before a change).
Reported per mode: median, min, max and the median absolute deviation (MAD) of samples/s; per
contender the ratio of medians to torchrun, the per-round paired ratios (median, MAD, range) and
in how many rounds treb was ahead. A ratio within about 2 MADs of 1.0, ahead in about half the
rounds, is noise; a real difference shows as a ratio outside that band in nearly every round.
Usage: python bench/train_speed.py [--rounds 7] [--epochs 50] [--threads N] [--sink pty|pipe]
                                   [--src DIR] [--metrics on|off]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402
from flood import Sink  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "digits-ddp"
PERF = re.compile(r"performance:\s*([0-9.eE+-]+)\s+samples_per_second")
MODES = ("treb-attached", "treb-detached", "torchrun")
ENDED = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "LOST"}


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def alive(pid: int, start: str | None) -> bool:
    """Whether `pid` is still the process that started at `start` (clock ticks, /proc stat
    field 22) and not a zombie; cheap enough to ask every 50 ms while the ranks train."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = stat.rsplit(b")", 1)[1].split()
    return fields[0] != b"Z" and (start is None or fields[19].decode() == start)


def mad(xs: list[float]) -> float:
    m = statistics.median(xs)
    return statistics.median(abs(x - m) for x in xs)


class Bench:
    def __init__(
        self, work: Path, src: Path, sink: str, epochs: int, threads: int, metrics: bool = True
    ) -> None:
        self.work = work
        self.sink = sink
        self.args = ["train.py", "--epochs", str(epochs)]
        env = {**os.environ, "TREB_HOME": str(work / "home"), "PYTHONPATH": str(src)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        self.env = env
        self.treb = [sys.executable, "-m", "trebuchet"]
        torchrun = shutil.which("torchrun", path=env["PATH"])
        if not torchrun:
            raise SystemExit("needs torchrun next to the Python that runs this (run `make bench`)")
        self.torchrun = torchrun
        self.spec = str(EXAMPLE / "job.yaml")
        self.override = ["-o", "command=" + " ".join(["python", *self.args])]
        if not metrics:  # the agents read no metrics (docs/metrics.md)
            self.override += ["-o", "metrics.ranks=[]"]
        self.count = 0  # runs so far: names each run and torchrun's checkpoint dir

    def treb_json(self, *argv: str) -> object:
        res = subprocess.run(
            [*self.treb, *argv, "--json"], env=self.env, cwd=EXAMPLE, capture_output=True, text=True
        )
        if res.returncode != 0:
            raise SystemExit(f"treb {' '.join(argv)} --json failed: {res.stderr[-2000:]}")
        return json.loads(res.stdout)

    def treb_figure(self, run_id: str, name: str) -> float:
        """The run's samples/s as `treb results` reads it; the run must have succeeded."""
        st = self.treb_json("status", run_id)
        assert isinstance(st, dict)
        if st["name"] != name or st["state"] != "SUCCEEDED":
            raise SystemExit(
                f"run {run_id} ({st['name']}) ended {st['state']}: see {st['run_dir']}"
            )
        rows = self.treb_json("results", run_id)
        assert isinstance(rows, list)
        perf = [r["performance"] for r in rows if r.get("metric") == "samples_per_second"]
        if not perf or perf[0] is None:
            raise SystemExit(f"run {run_id}: no samples_per_second in `treb results --json`")
        return float(perf[0])

    def attached(self) -> tuple[float, float]:
        name = f"speed-att-{self.count}"
        sink = Sink(self.sink)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [*self.treb, "run", self.spec, *self.override, "--name", name],
            env=self.env,
            cwd=EXAMPLE,
            stdin=subprocess.DEVNULL,
            stdout=sink.write_fd,
            stderr=sink.write_fd,
        )
        try:
            rc = proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - t0
        sink.close()
        if rc != 0:
            raise SystemExit(f"attached `treb run` exited {rc}")
        st = self.treb_json("status")  # the latest run: this one
        assert isinstance(st, dict)
        return self.treb_figure(st["id"], name), wall

    def detached(self) -> tuple[float, float]:
        name = f"speed-det-{self.count}"
        t0 = time.perf_counter()
        res = subprocess.run(
            [*self.treb, "run", "--detach", self.spec, *self.override, "--name", name],
            env=self.env,
            cwd=EXAMPLE,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if res.returncode != 0 or not res.stdout.split():
            raise SystemExit(f"`treb run --detach` exited {res.returncode}: {res.stderr[-2000:]}")
        run_id = res.stdout.split()[0]
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            st = self.treb_json("status", run_id)
            assert isinstance(st, dict)
            if st["state"] in ENDED:
                break
            pid = st.get("supervisor_pid")
            if pid:  # wait for it without starting a process every poll
                while alive(pid, st.get("supervisor_start")) and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.05)
            else:  # not recorded (yet): ask again, rarely, to stay off the ranks' CPUs
                time.sleep(1.0)
        else:
            raise SystemExit(f"detached run {run_id} still running after 600 s")
        return self.treb_figure(run_id, name), time.perf_counter() - t0

    def torchrun_(self) -> tuple[float, float]:
        ckpt = self.work / f"ckpt-torchrun-{self.count}"  # fresh: no resume, same saves as treb
        env = {**self.env, "TREB_CHECKPOINT_DIR": str(ckpt)}
        t0 = time.perf_counter()
        res = subprocess.run(
            [self.torchrun, "--standalone", "--nproc_per_node", "2", *self.args],
            env=env,
            cwd=EXAMPLE,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        wall = time.perf_counter() - t0
        found = PERF.findall(res.stdout)
        if res.returncode != 0 or not found:
            raise SystemExit(f"torchrun exited {res.returncode}: {res.stderr[-2000:]}")
        return float(found[-1]), wall

    def run(self, mode: str) -> tuple[float, float]:
        """(samples/s, wall seconds of the launch up to the end seen) of one run of `mode`."""
        self.count += 1
        return {
            "treb-attached": self.attached,
            "treb-detached": self.detached,
            "torchrun": self.torchrun_,
        }[mode]()


def compare(name: str, xs: list[float], base: list[float]) -> str:
    ratios = [x / b for x, b in zip(xs, base, strict=True)]
    ahead = sum(r >= 1.0 for r in ratios)
    return (
        f"{name} / torchrun: {median(xs) / median(base):.3f} (ratio of medians; target "
        f">= 1.0); per round {median(ratios):.3f} +- {mad(ratios):.3f} MAD, range "
        f"{min(ratios):.3f}-{max(ratios):.3f}, treb ahead in {ahead}/{len(ratios)} rounds"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--epochs", type=int, default=50, help="train.py --epochs (50: ~6 s a run)")
    ap.add_argument(
        "--threads",
        type=int,
        default=max(1, usable_cpus() // 2),
        help="OMP_NUM_THREADS for every mode (default: usable CPUs // 2 ranks)",
    )
    ap.add_argument("--sink", choices=["pty", "pipe"], default="pty")
    ap.add_argument("--src", type=Path, default=ROOT)
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--metrics", choices=["on", "off"], default="on",
                    help="off: treb's runs with -o metrics.ranks=[] (no metrics read)")  # fmt: skip
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), args.src.resolve(), args.sink, args.epochs, args.threads,
                  args.metrics == "on")  # fmt: skip
        print(
            f"# training speed, examples/digits-ddp --epochs {args.epochs}, 2 ranks, "
            f"OMP_NUM_THREADS={args.threads} for all modes, code from {args.src}, metrics "
            f"{args.metrics}, {machine()}; "
            f"{args.rounds} alternating rounds (order rotated) after {args.warmup} warm-up, "
            f"attached output to a {args.sink}; samples/s (wall s)",
            flush=True,
        )
        for _ in range(args.warmup):
            for mode in MODES:
                b.run(mode)
        perf: dict[str, list[float]] = {m: [] for m in MODES}
        wall: dict[str, list[float]] = {m: [] for m in MODES}
        for i in range(args.rounds):
            for mode in MODES[i % 3 :] + MODES[: i % 3]:
                p, w = b.run(mode)
                perf[mode].append(p)
                wall[mode].append(w)
            print(
                f"round {i}: "
                + "  ".join(f"{m} {perf[m][-1]:.0f} ({wall[m][-1]:.1f}s)" for m in MODES),
                flush=True,
            )
        print(
            f"{'mode':<14} {'median':>9} {'min':>9} {'max':>9} {'MAD':>7} {'MAD%':>5} {'wall s':>6}"
        )
        for m in MODES:
            xs = perf[m]
            print(
                f"{m:<14} {median(xs):>9.0f} {min(xs):>9.0f} {max(xs):>9.0f} {mad(xs):>7.0f} "
                f"{100 * mad(xs) / median(xs):>5.1f} {median(wall[m]):>6.2f}"
            )
        for m in MODES[:2]:
            print(compare(m, perf[m], perf["torchrun"]))


if __name__ == "__main__":
    main()
