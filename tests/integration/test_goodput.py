"""Goodput on real runs: a scripted CPU training (gloo, 2 ranks) with known losses, checked
against the script's own clock; a program that never gets past its last checkpoint, stopped
by max_attempts_without_progress whatever `retries` says."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, status_json, write_spec

pytestmark = pytest.mark.integration
TRAIN = REPO / "tests" / "integration" / "scripts" / "goodput_train.py"
TOL_S = 2.0


def clocks(folder: Path) -> dict[int, list[tuple[float, str, int]]]:
    """Every attempt's notes, both ranks' together, in time order."""
    out: dict[int, list[tuple[float, str, int]]] = {}
    for path in folder.glob("clock-*-*"):
        attempt = int(path.name.split("-")[1])
        for line in path.read_text().splitlines():
            t, what, step = line.split()
            out.setdefault(attempt, []).append((float(t), what, int(step)))
    return {a: sorted(v) for a, v in out.items()}


def first(notes: list[tuple[float, str, int]], what: str, step: int | None = None) -> float:
    return min(t for t, w, s in notes if w == what and (step is None or s == step))


def last(notes: list[tuple[float, str, int]], what: str, step: int | None = None) -> float:
    return max(t for t, w, s in notes if w == what and (step is None or s == step))


def wait_for(path: Path, text: str, run: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        if path.exists() and text in path.read_text():
            return
        time.sleep(0.05)
    out = run.communicate()[0] if run.poll() is not None else ""
    raise AssertionError(f"{path} never said {text!r}: {out}")


def scenario(treb, treb_home: Path, tmp_path: Path, *on: str) -> None:
    """The scripted training with a rank killed at step 25 of the first attempt and rank 1
    hung (treb fault) past checkpoint 30 of the second: `treb goodput --json` against the
    script's own clock."""
    needs("torch")
    clock = tmp_path / "clock"
    clock.mkdir()
    spec = write_spec(
        tmp_path,
        f"""
name: goodput
command: [{sys.executable}, {TRAIN}]
procs_per_node: 2
retries: 3
hang_timeout: 10s
on_hang: retry
grace_period: 2s
env: {{CLOCK_DIR: "{clock}", GOODPUT_SRC: "{REPO}", OMP_NUM_THREADS: "1"}}
""",
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "trebuchet", "run", str(spec), *on],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the second attempt (after the kill) passes its checkpoint 30: rank 1 hangs (SIGSTOP)
        wait_for(clock / "clock-1-0", " step 31\n", run, timeout=300)
        (run_id,) = [p.name for p in (treb_home / "runs").iterdir()]
        res = treb("fault", run_id, "hang-rank", "1")
        assert res.returncode == 0, res.stderr
        out, _ = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    assert "goodput " in out  # the end-of-run line
    res = treb("goodput", "--json")
    assert res.returncode == 0, res.stderr
    g = json.loads(res.stdout)["runs"][0]
    notes = clocks(clock)
    assert sorted(notes) == [0, 1, 2]
    a0, a1, a2 = notes[0], notes[1], notes[2]
    # the script's own clock: what was kept, redone, hung and restarted
    hang_from = last(a1, "step")
    saved = max(t for t, w, _ in a1 if w == "checkpoint" and t <= hang_from)
    kept = first(a0, "checkpoint", 20) - first(a0, "step")
    kept += saved - first(a1, "step")
    kept += last(a2, "step", 50) - first(a2, "step")
    redone = first(a0, "kill") - first(a0, "checkpoint", 20)
    redone += hang_from - saved
    hung = first(a1, "signal") - hang_from
    restart = (first(a1, "step") - first(a0, "kill")) + (first(a2, "step") - first(a1, "signal"))
    lost = g["lost"]
    seen = {"productive": g["productive_s"], "redone": lost["redone"], "hang": lost["hang"],
            "restart": lost["restart"]}  # fmt: skip
    want = {"productive": kept, "redone": redone, "hang": hung, "restart": restart}
    print(json.dumps({"treb": seen, "script": want, "ettr": g["ettr"], "wall": g["wall_s"]}))
    for cause, value in want.items():
        assert abs(seen[cause] - value) <= TOL_S, (cause, seen, want, g)
    assert abs(g["ettr"] - kept / g["wall_s"]) <= 0.02, (g, kept)
    assert abs(sum(lost.values()) + g["productive_s"] - g["wall_s"]) < 0.01
    assert g["attempts"] == 3 and g["steps_seen"] is True
    st = status_json(treb)
    assert abs(st["goodput"]["ettr"] - g["ettr"]) < 0.01


def test_goodput_of_a_training_with_a_killed_rank_and_a_hang(
    treb, treb_home: Path, tmp_path: Path
) -> None:
    scenario(treb, treb_home, tmp_path)


STUCK = """
import os, sys, time
d = os.environ["TREB_CHECKPOINT_DIR"]
saved = sorted(int(n[5:]) for n in os.listdir(d) if n.startswith("ckpt-"))
step = saved[-1] if saved else 0
last = step
while True:
    time.sleep(0.05)
    step += 1
    print(f"step={step}", flush=True)
    if step % 5 == 0:
        open(os.path.join(d, f"ckpt-{step}"), "w").close()
        last = step
    if step == last + 2 and saved:
        sys.exit(3)
    if step == 7:
        sys.exit(3)
"""


def test_attempts_without_progress_stop_the_run_whatever_retries_remain(
    treb, tmp_path: Path
) -> None:
    """Fails 2 steps after its last checkpoint, every attempt: the first one checkpoints
    (step 5), the next three keep nothing; with retries: 10 the run ends after them."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    spec = write_spec(tmp_path, f"command: [{sys.executable}, {script}]\nretries: 10\n")
    res = treb("run", str(spec), timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr
    st = status_json(treb)
    assert st["state"] == "FAILED"
    assert len(st["attempts"]) == 4, st["attempts"]
    assert st["attempts"][-1]["reason"] == "no_progress: no_retry"
    said = res.stdout + res.stderr
    assert "3 attempts in a row kept no work" in said
    events = [json.loads(line) for line in
              (Path(st["run_dir"]) / "events.jsonl").read_text().splitlines()]  # fmt: skip
    stop = [e for e in events if e["event"] == "no_progress"]
    assert [(e["attempt"], e["attempts"], e["limit"]) for e in stop] == [(3, 3, 3)]
