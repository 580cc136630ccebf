"""What a rank prints, or does to its own log, can never hurt its run or freeze a verb
(issue 25): hostile metric lines, non-finite numbers, a flood of metric names, a log
replaced by a FIFO; and a queued sweep point is not taken for lost while it waits."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration
HOSTILE = r"""
import sys
print('{"loss": 1' + '0' * 400 + '}', flush=True)  # OverflowError in float()
print('{"a": ' + '[' * 1100 + ']' * 1100 + '}', flush=True)  # RecursionError in json
print('performance: 1e999 samples_per_second', flush=True)  # inf
print('{"loss": NaN, "acc": Infinity, "lr": 0.5}', flush=True)
print('{"step": 2, "loss": 0.25}', flush=True)
"""


def test_hostile_metric_lines_never_hurt_the_run(treb, tmp_path: Path) -> None:
    """Before: the run went LOST (its ranks killed) and `treb run` exited 1 with a
    traceback; `treb metrics` crashed on the stored infinity."""
    (tmp_path / "hostile.py").write_text(HOSTILE)
    spec = write_spec(tmp_path, "command: python hostile.py\nsnapshot: false\n")
    res = treb("run", str(spec), timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "SUCCEEDED" in res.stderr
    assert status_json(treb)["state"] == "SUCCEEDED"
    assert "were not finite numbers" in res.stderr  # counted, said in the summary
    table = treb("metrics", timeout=60)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    data = json.loads(treb("metrics", "--json", timeout=60).stdout)
    assert data["metrics"]["loss"]["last"]["value"] == 0.25
    assert data["dropped"]["nonfinite"] == 4 and "acc" not in data["metrics"]
    rows = json.loads(treb("results", "--json", timeout=60).stdout)
    assert [r["performance"] for r in rows] == [None]  # 1e999 is no value


def test_metric_names_past_the_cap_are_counted_and_said_once(treb, tmp_path: Path) -> None:
    many = (
        "import json, os\nr = os.environ['RANK']\n"
        "print(json.dumps({f'r{r}_{i}': i for i in range(200)}), flush=True)\n"
    )
    (tmp_path / "many.py").write_text(many)
    spec = write_spec(tmp_path, "command: python many.py\nprocs_per_node: 2\n"
                      "snapshot: false\nmetrics: {ranks: all}\n")  # fmt: skip
    res = treb("run", str(spec), timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(treb("metrics", "--json", timeout=60).stdout)
    assert len(data["metrics"]) == 256 and data["dropped"]["names"] == 400 - 256
    assert "past the first 256 were not kept" in treb("metrics", timeout=60).stderr
    events = (Path(status_json(treb)["run_dir"]) / "events.jsonl").read_text()
    assert events.count('"metrics_capped"') == 1


FIFO = r"""
import glob, os, sys, time
if os.environ["RANK"] == "0":
    log = os.path.join(os.environ["TREB_RUN_DIR"], "attempt-0", "rank-0.log")
    print("before the fifo", flush=True)
    time.sleep(1.5)
    os.remove(log)
    os.mkfifo(log)
    print("Traceback (most recent call last):\nRuntimeError: gone", file=sys.stderr, flush=True)
    time.sleep(2)
    sys.exit(1)
time.sleep(60)
"""


def test_a_log_replaced_by_a_fifo_freezes_no_verb(treb, tmp_path: Path) -> None:
    """Before: the attached run's end, `treb status`, `treb logs` and `treb diagnose` hung
    opening the FIFO. The timeouts are hang guards, not timings."""
    (tmp_path / "fifo.py").write_text(FIFO)
    spec = write_spec(tmp_path, "command: python fifo.py\nprocs_per_node: 2\nsnapshot: false\n")
    res = treb("run", str(spec), timeout=120)
    assert res.returncode == 1 and "FAILED" in res.stderr, res.stderr
    run = status_json(treb)
    assert run["state"] == "FAILED"
    assert (Path(run["run_dir"]) / "attempt-0" / "rank-0.log").is_fifo()
    for verb in (["status"], ["logs"], ["logs", "--rank", "0"], ["logs", "--tail", "5"],
                 ["logs", "-f"], ["diagnose"], ["results"], ["metrics"], ["stacks"]):  # fmt: skip
        got = treb(*verb, timeout=60)
        assert "Traceback" not in got.stderr, (verb, got.stderr)


def test_a_queued_sweep_point_is_not_lost_while_the_driver_lives(treb, tmp_path: Path) -> None:
    """Before: once the running point had run ORPHAN_PENDING_S (60 s; 1 s here), any
    `treb ps` marked the queued point LOST and the driver never ran it."""
    spec = write_spec(tmp_path, "command: 'sleep 4; echo $X'\nsnapshot: false\n"
                      "sweep:\n  env.X: [a, b]\nsweep_parallel: 1\n")  # fmt: skip
    env = {"TREB_ORPHAN_PENDING_S": "1"}
    res = treb("run", "-d", str(spec), env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    deadline = time.monotonic() + 90
    states: list[str] = []
    while time.monotonic() < deadline:
        runs = json.loads(treb("ps", "--json", env=env, timeout=60).stdout)
        states = [r["state"] for r in sorted(runs, key=lambda r: r["created_at"])]
        assert "LOST" not in states, states
        if len(states) == 2 and all(s in ("SUCCEEDED", "FAILED") for s in states):
            break
        time.sleep(0.5)
    assert states == ["SUCCEEDED", "SUCCEEDED"], states
