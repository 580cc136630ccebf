"""What the goodput accounting costs the supervisor: its CPU with and without it.

A 2-rank program (stdlib only) prints `step=N loss=...` every 50 ms for `--seconds`, fails
once after a third of them (so the no-progress rule reads the attempt's marks and the
checkpoint folder), checkpoints every 100 steps (and prints the HuggingFace Trainer's line
for it); "with": every step, its arrival (`compute`) and checkpoint marked
(trebuchet.dist.mark, $TREB_MARKS), max_attempts_without_progress at its default, the
straggler watch and the checkpoint lines on (their defaults); "without": no marks,
`-o max_attempts_without_progress=0`, `straggler_threshold: 0`, `checkpoint_pattern: ''`.
Each run is detached; the supervisor's utime + stime (/proc/PID/stat, pid from the
run_started event) is sampled every 0.1 s until it exits. Rounds alternate; the medians
are printed, in % of one core.
The accounting itself (`treb goodput`) runs in the CLI, on demand, not in the supervisor.
Usage: python bench/goodput_cost.py [--rounds 3] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAM = """
import os, sys, time
sys.path.insert(0, os.environ["SRC"])
from trebuchet.dist import mark
if os.environ.get("NO_MARKS"):
    mark = lambda *a: None
d, attempt = os.environ["TREB_CHECKPOINT_DIR"], int(os.environ["TREB_ATTEMPT"])
t0, step, dur = time.time(), 0, float(os.environ["DUR"])
while time.time() - t0 < (dur / 3 if attempt == 0 else dur * 2 / 3):
    time.sleep(0.05)
    step += 1
    mark("compute", step)
    print(f"step={step} loss={1 / step:.4f}", flush=True)
    mark("step", step)
    if step % 100 == 0 and os.environ["RANK"] == "0":
        open(os.path.join(d, f"ckpt-{step}"), "w").close()
        mark("checkpoint", step)
        print(f"Saving model checkpoint to {d}/checkpoint-{step}", flush=True)
sys.exit(1 if attempt == 0 else 0)
"""


def one(folder: Path, seconds: float, with_it: bool) -> tuple[float, float]:
    """(supervisor CPU seconds, its wall seconds) of one run."""
    home = folder / ("with" if with_it else "without")
    home.mkdir(parents=True, exist_ok=True)
    prog = folder / "prog.py"
    prog.write_text(PROGRAM)
    env_block = f"{{SRC: '{REPO}', DUR: '{seconds}'" + ("" if with_it else ", NO_MARKS: '1'") + "}"
    spec = home / "b.yaml"
    off = "" if with_it else "straggler_threshold: 0\ncheckpoint_pattern: ''\n"
    spec.write_text(f"name: b\ncommand: [{sys.executable}, {prog}]\nprocs_per_node: 2\n"
                    f"retries: 1\nenv: {env_block}\n{off}")  # fmt: skip
    env = {**os.environ, "TREB_HOME": str(home), "PYTHONPATH": str(REPO)}
    args = [] if with_it else ["-o", "max_attempts_without_progress=0"]
    subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec), "--detach", *args],
                   env=env, check=True, capture_output=True)  # fmt: skip
    run = max((home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    pid = None
    while pid is None:
        events = run / "events.jsonl"
        for line in events.read_text().splitlines() if events.exists() else []:
            e = json.loads(line)
            if e["event"] == "run_started":
                pid = e["pid"]
        time.sleep(0.05)
    tick, cpu, t0 = os.sysconf("SC_CLK_TCK"), 0.0, time.monotonic()
    while True:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            break
        if fields[0] == "Z":
            break
        cpu = (int(fields[11]) + int(fields[12])) / tick
        time.sleep(0.1)
    return cpu, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=60.0)
    a = ap.parse_args()
    shares: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for with_it in (True, False) if r % 2 == 0 else (False, True):
                cpu, wall = one(Path(tmp) / str(r), a.seconds, with_it)
                key = "with" if with_it else "without"
                shares[key].append(100 * cpu / wall)
                print(f"round {r + 1} {key:<7} supervisor {cpu:.2f} s CPU in {wall:.1f} s: "
                      f"{100 * cpu / wall:.3f} % of one core", flush=True)  # fmt: skip
    w, wo = statistics.median(shares["with"]), statistics.median(shares["without"])
    print(f"median: with {w:.3f} %, without {wo:.3f} % of one core; the accounting: "
          f"{w - wo:+.3f} %")  # fmt: skip


if __name__ == "__main__":
    main()
