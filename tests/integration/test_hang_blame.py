"""Issue 38 item 3, on real programs: who is blamed for a hang. The HF Trainer as users run
it (transformers 5.x, accelerate; scripts/hf_tiny.py: a 2-layer GPT-2, 2 ranks, CPU/gloo,
only rank 0 prints) with rank 0 hung, by a sleep in its training step or by `treb fault
hang-rank 0` (SIGSTOP): diagnosed as rank 0, with its stack, where rank 1 (silent since its
start) used to be blamed. A plain torch program whose rank 1 hangs while rank 0 keeps
printing, without stacks: still rank 1 (no regression). `treb stacks` on a stopped rank
and on a rank py-spy cannot read (its own reason). Outcomes only, never times."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, needs_program, status_json, write_spec

pytestmark = pytest.mark.integration
PY = sys.executable
HF = REPO / "tests" / "integration" / "scripts" / "hf_tiny.py"


def hf_spec(tmp_path: Path, env: str = "") -> Path:
    shutil.copy(HF, tmp_path / "hf_tiny.py")
    return write_spec(tmp_path, f"command: [{PY}, hf_tiny.py]\nprocs_per_node: 2\n"
                                f"hang_timeout: 8s\non_hang: fail\ngrace_period: 2s\n{env}")  # fmt: skip


def line_of(marker: str) -> int:
    return next(i for i, t in enumerate(HF.read_text().splitlines(), 1) if marker in t)


def wait_ready(treb, run_dir: Path, ranks: tuple[int, ...] = (0, 1)) -> None:
    deadline = time.monotonic() + 240
    while not all((run_dir / f"ready-{r}").exists() for r in ranks):
        assert time.monotonic() < deadline, "the ranks never got going"
        assert status_json(treb)["state"] in ("PENDING", "RUNNING"), status_json(treb)
        time.sleep(0.5)


def wait_end(treb, run: str) -> dict:
    deadline = time.monotonic() + 240
    while (st := status_json(treb, run))["state"] in ("PENDING", "RUNNING", "RETRYING"):
        assert time.monotonic() < deadline, st
        time.sleep(0.5)
    return st


def assert_rank_0_blamed(treb, st: dict) -> str:
    """The run ended for a hang, rank 0 the root cause, rank 1 never 'silent first'."""
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("FAILED", "hang")], st
    root = st["diagnosis"]["root_cause"]
    assert (root["category"], root["rank"]) == ("hang", 0), root
    diag = treb("diagnose", st["id"]).stdout
    assert "cause:    hang on rank 0: " in diag, diag
    assert "rank 1 went silent first" not in diag, diag
    return diag


def test_hf_trainer_rank_0_asleep_in_its_step_is_blamed(treb, tmp_path: Path) -> None:
    """Before: 'hang on rank 1: 1 of 2 ranks wait in time.sleep (hf_tiny.py:59); rank 1 is
    in all_gather (hf_tiny.py:77)'."""
    needs("transformers")
    res = treb("run", str(hf_spec(tmp_path, "env:\n  HF_HANG_SLEEP: '1'\n")), timeout=300)
    assert res.returncode == 1, res.stderr[-3000:]
    diag = assert_rank_0_blamed(treb, status_json(treb))
    assert f"rank 0 is in time.sleep (hf_tiny.py:{line_of('HF-HANG-LINE')})" in diag, diag
    assert "hang on rank 0: rank 1 waits in all_gather" in diag, diag
    run_dir = Path(status_json(treb)["run_dir"])
    stack = (run_dir / "attempt-0" / "stacks" / "rank-0.txt").read_text()
    assert "on_step_end" in stack and "_inner_training_loop" in stack, stack


def test_hf_trainer_rank_0_stopped_by_treb_fault_is_blamed(treb, tmp_path: Path) -> None:
    """The issue's case. Before: 'hang on rank 1: ... rank 1 is in _engine_run_backward
    ..., silent for 16s' (rank 0's stack, read, was in the bigger group)."""
    needs("transformers")
    needs_program("py-spy")
    res = treb("run", str(hf_spec(tmp_path)), "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    wait_ready(treb, Path(st["run_dir"]))
    assert treb("fault", st["id"], "hang-rank", "0").returncode == 0
    st = wait_end(treb, st["id"])
    diag = assert_rank_0_blamed(treb, st)
    assert "stopped (SIGSTOP or a debugger)" in diag, diag
    text = (Path(st["run_dir"]) / "attempt-0" / "stacks" / "rank-0.txt").read_text()
    assert " method py-spy --nonblocking " in text.splitlines()[0], text
    assert "# state stopped" in text and "_inner_training_loop" in text, text


LATE = """\
import os, time
from trebuchet.dist import heartbeat
heartbeat()
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
heartbeat()
rank = dist.get_rank()
for step in range(100000):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"step {step}", flush=True)
    if step == 40 and rank == 1:
        time.sleep(3600)
    if step == 40:
        for i in range(10):
            print(f"rank 0 still works {i}", flush=True)
            time.sleep(0.5)
    time.sleep(0.2)
"""


def test_plain_torch_rank_1_hung_while_rank_0_prints_is_still_named(treb, tmp_path) -> None:
    """No regression: every rank prints each step; rank 1 stops, rank 0 prints 5 s more
    and then waits in all_reduce. Without stacks (no py-spy), the timelines name rank 1."""
    needs("torch")
    (tmp_path / "late.py").write_text(LATE)
    spec = write_spec(tmp_path, f"command: [{PY}, late.py]\nprocs_per_node: 2\n"
                                "hang_timeout: 6s\ngrace_period: 1s\n")  # fmt: skip
    res = treb("run", str(spec), timeout=300, env={"TREB_PY_SPY": ""})
    assert res.returncode == 1, res.stderr[-3000:]
    st = status_json(treb)
    root = st["diagnosis"]["root_cause"]
    assert (root["category"], root["rank"]) == ("hang", 1), root
    assert "rank 1 went silent first" in res.stderr, res.stderr[-3000:]


TWO = f"""\
[ "$RANK" = 1 ] && exec sleep 300
exec {PY} -c "import time
print('ready', flush=True)
while True: time.sleep(0.2)"
"""


def test_treb_stacks_reads_a_stopped_rank_and_says_why_py_spy_could_not(treb, tmp_path) -> None:
    """Rank 0 (Python) stopped by `treb fault hang-rank`, rank 1 not a Python process.
    Before: rank 1 as '== rank 1 (none): in no stacks' with no reason (and the reason in
    its file the last line of py-spy's backtrace)."""
    needs_program("py-spy")
    (tmp_path / "two.sh").write_text(TWO)
    spec = write_spec(tmp_path, "command: [bash, two.sh]\nprocs_per_node: 2\n")
    assert treb("run", str(spec), "--detach").returncode == 0
    st = status_json(treb)
    log = Path(st["run_dir"]) / "attempt-0" / "rank-0.log"
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and "ready" in log.read_text()):
            assert time.monotonic() < deadline, "rank 0 never started"
            time.sleep(0.3)
        assert treb("fault", st["id"], "hang-rank", "0").returncode == 0
        out = treb("stacks", st["id"], timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "== rank 0 (py-spy --nonblocking, stopped (SIGSTOP or a debugger)): in" in out.stdout
        assert "<module> (<string>:3)" in out.stdout, out.stdout
        assert ("== rank 1: no stacks: py-spy dump --nonblocking: Failed to find python "
                "version from target process") in out.stdout, out.stdout  # fmt: skip
        assert status_json(treb, st["id"])["state"] == "RUNNING"
    finally:
        treb("cancel", st["id"], timeout=120)
