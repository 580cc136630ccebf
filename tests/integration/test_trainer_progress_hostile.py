"""Issue 38's progress reader on real runs against a hostile rank 0 (adversary): it prints
fake `Total optimization steps` lines, a \\r storm of ~1 MB/s of lines that cost the
square of their length to the old regexes, and a resumed bar whose tqdm rate counts the
jump to its checkpoint; it is retried three times, then stalls. `treb status` must show
the bar that runs (total 300), a rate measured from the last resume, then `stalled`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration

JOB = r"""
import os, sys, time
from pathlib import Path
ck = Path(sys.argv[1])
start = int(ck.read_text()) if ck.exists() else 0
out = sys.stdout
out.write("  Total optimization steps = 5\n  Total optimization steps = 1e999\n")
out.write("  Total optimization steps = " + "9" * 2000 + "\n")
storm = ("1" * 2000 + " /s\r" + "Validation" + " " * 1900 + "| 1/2000 [00:01<00:01]\r"
         + "metrics: " + "a" * 8000 + "\r"
         + "Epoch 1/9 4/8 0:00:01 3.2it/s \x1b[31mtrain_loss\x1b[0m: 0.5\r") * 8

def bar(n, rate):
    out.write(f" {n * 100 // 300}%|#   | {n}/300 [00:01<00:10, {rate}it/s]\r")
    out.flush()

bar(start, "999.0")  # tqdm's rate right after the resume: the jump to the checkpoint
for n in range(start + 1, 301):
    if start < 60 and n == start + 20:  # attempts 0, 1, 2: a checkpoint, then a crash
        ck.write_text(str(n))
        sys.exit(1)
    if n == 150:  # hung: nothing more
        time.sleep(600)
    for _ in range(2):  # ~ 1 MB/s of redraws
        out.write(storm)
    bar(n, "10.0")
    time.sleep(0.1)
"""


def watch(treb, run: str, until, timeout: float = 120) -> dict:
    end = time.monotonic() + timeout
    last: dict = {}
    while time.monotonic() < end:
        last = status_json(treb, run)
        if until(last):
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out; last {last.get('state')} {last.get('progress')}")


def test_hostile_rank_resumed_three_times_then_stalled(treb, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(JOB)
    spec = write_spec(
        tmp_path,
        f"name: hostile\ncommand: python job.py {tmp_path / 'ck'}\nretries: 3\n"
        "metrics: {prefix: 'metrics:'}\n",
    )
    res = treb("run", "-d", str(spec))
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:

        def midway(s: dict) -> bool:
            p = s.get("progress")
            return bool(s.get("attempt") == 3 and p and p["rate"] and 80 <= p["step"] < 150)

        got = watch(treb, run, midway)
        p = got["progress"]
        assert p["total"] == 300 and p["stalled_s"] is None
        assert 1 < p["rate"] < 50, p  # measured: ~10 steps/s, not tqdm's 999 from the jump
        got = watch(treb, run, lambda s: (s.get("progress") or {}).get("stalled_s") is not None)
        p = got["progress"]
        assert p["eta_s"] is None and p["step"] == 149 and p["total"] == 300
        text = treb("status", run).stdout
        assert re.search(r"progress \d+% 149/300.*stalled: no step for", text), text
        assert "\x1b" not in text
    finally:
        treb("cancel", run)


HEARTBEAT = r"""
import sys, time
while True:  # hung at the resumed step, a watchdog printing where it is
    print("step 30/60", flush=True)
    time.sleep(0.5)
"""


def test_a_step_printed_again_and_again_without_advancing_is_stalled(treb, tmp_path: Path) -> None:
    """No step advanced this attempt, but the line is printed every 0.5 s: stalled after
    STALL_MIN_S, as a silent run is (the record's `moved` was each reading's time)."""
    (tmp_path / "job.py").write_text(HEARTBEAT)
    res = treb("run", "-d", str(write_spec(tmp_path, "name: beat\ncommand: python job.py\n")))
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:
        got = watch(treb, run, lambda s: (s.get("progress") or {}).get("step") == 30)
        assert got["progress"]["stalled_s"] is None
        got = watch(treb, run, lambda s: s["progress"]["stalled_s"] is not None, timeout=45)
        assert got["progress"]["eta_s"] is None and got["progress"]["stalled_s"] >= 15
    finally:
        treb("cancel", run)
