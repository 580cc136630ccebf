"""Adversary, issue 38 item 3, with the real treb and real ranks (plain Python): a rank
that plants a stack file of a name that is no rank (the supervisor died on it, the run
LOST), and a rank whose thread name holds terminal escapes (`treb stacks` printed them
raw). Outcomes only, never times."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_program, status_json, write_spec

pytestmark = pytest.mark.integration
PY = sys.executable

PLANT = """\
import os, time
d = os.path.dirname(os.environ["TREB_STACKS_FILE"])
if os.environ["RANK"] == "1":
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "rank-\\u00b2.txt"), "w") as f:  # a later request's answer
        f.write("# request 99999999999.0-1 method py-spy pid 1\\n# state stopped\\n")
print("ready", flush=True)
time.sleep(300)
"""


def test_a_planted_stack_file_of_no_rank_neither_kills_nor_blames(treb, tmp_path) -> None:
    """Before: the supervisor's traceback (ValueError: invalid literal for int(): '²'),
    the run LOST."""
    (tmp_path / "plant.py").write_text(PLANT)
    spec = write_spec(tmp_path, f"command: [{PY}, plant.py]\nprocs_per_node: 2\n"
                                "hang_timeout: 4s\non_hang: fail\ngrace_period: 1s\n")  # fmt: skip
    res = treb("run", str(spec), timeout=120)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    st = status_json(treb)
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("FAILED", "hang")], st
    assert st["diagnosis"]["root_cause"]["rank"] is None, st["diagnosis"]
    assert "\u00b2" not in treb("diagnose", st["id"]).stdout


ESCAPES = """\
import threading, time
threading.current_thread().name = "\\x1b]0;pwned\\x07\\x1b[2J"
print("ready", flush=True)
while True:
    time.sleep(0.2)
"""


def test_treb_stacks_shows_a_rank_s_escapes_inert(treb, tmp_path) -> None:
    """Before: the thread name's OSC title and screen clear reached the terminal raw."""
    needs_program("py-spy")
    (tmp_path / "esc.py").write_text(ESCAPES)
    spec = write_spec(tmp_path, f"command: [{PY}, esc.py]\nprocs_per_node: 2\n")
    assert treb("run", str(spec), "--detach").returncode == 0
    st = status_json(treb)
    logs = [Path(st["run_dir"]) / "attempt-0" / f"rank-{r}.log" for r in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while not all(p.exists() and "ready" in p.read_text() for p in logs):
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.3)
        out = treb("stacks", st["id"], timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "== ranks 0, 1 (py-spy" in out.stdout, out.stdout
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout, repr(out.stdout)
        assert "^[]0;pwned^G^[[2J" in out.stdout, out.stdout
    finally:
        treb("cancel", st["id"], timeout=120)


THREE = """\
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
print("ready", flush=True)
if rank == 0:
    dist.all_reduce(t)  # waits for ranks 1 and 2
else:
    time.sleep(300)  # THREE-SLEEP
"""


def test_three_ranks_two_outside_the_collective_do_not_blame_the_waiting_one(treb, tmp_path):
    """Real gloo ranks: 1 and 2 sleep at one line, rank 0 waits for them in all_reduce.
    Before: 'hang on rank 0' (its stack was the one that differed)."""
    needs_program("py-spy")
    pytest.importorskip("torch")
    (tmp_path / "three.py").write_text(THREE)
    spec = write_spec(tmp_path, f"command: [{PY}, three.py]\nprocs_per_node: 3\n"
                                "hang_timeout: 6s\non_hang: fail\ngrace_period: 1s\n")  # fmt: skip
    res = treb("run", str(spec), timeout=240)
    assert res.returncode == 1, res.stderr[-3000:]
    st = status_json(treb)
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("FAILED", "hang")], st
    diag = treb("diagnose", st["id"]).stdout
    assert "ranks 1, 2 are in time.sleep (three.py:12)" in diag, diag
    assert st["diagnosis"]["root_cause"]["rank"] != 0, st["diagnosis"]
