"""Adversary, issue 38 item 3: who a hang blames, when the ranks write the run directory
(hang.json, the stack files) and show odd stacks. Every hang.json field of any type or
value reads without a traceback and with finite figures; a stack file the agents were not
asked for (a name that is no rank of the attempt, `rank-²`) is no rank; the rank waiting
in the collective is never the one blamed while two others are outside it; and py-spy's
stacks are read from py-spy's JSON (test_adversary_stacks.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fast.test_hang_judging import NO_SPY, TRAINER, attempt, stack
from trebuchet.diagnose import hang as dhang


def diagnosed(adir: Path) -> dict:
    found = dhang.for_run({"run_dir": str(adir.parent), "attempt": 0, "state": "FAILED"})
    assert found is not None
    return found


def forged(tmp_path: Path, **fields: object) -> Path:
    adir = attempt(tmp_path, TRAINER, dict.fromkeys(range(2), NO_SPY))
    info = json.loads((adir / "hang.json").read_text())
    info.update(fields)
    (adir / "hang.json").write_text(json.dumps(info))
    return adir


BAD = [None, "abc", [1], {"a": 1}, True, float("nan"), float("inf"), -float("inf"), 10**400,
       -1e308, 1e308, "rank-0"]  # fmt: skip


@pytest.mark.parametrize("key", ["detected_at", "last_progress", "hang_timeout", "action",
                                 "expected", "stacks", "habits"])  # fmt: skip
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_a_planted_hang_json_field_reads_without_a_traceback(tmp_path, key, value) -> None:
    """Before: ValueError, TypeError, OverflowError or KeyError out of `treb diagnose`,
    `treb status` (on_hang: warn) and the supervisor's hang lines."""
    adir = forged(tmp_path, **{key: value})
    found = diagnosed(adir)
    lines = dhang.hang_lines(adir)
    assert len(lines) == 2 and all("nan" not in ln and "inf" not in ln for ln in lines), lines
    assert found["rank"] in (None, 0, 1), found
    for r in dhang.read(adir).ranks:
        assert r.silent is None or math.isfinite(r.silent)


def test_a_huge_habit_count_is_no_habit(tmp_path: Path) -> None:
    """Before: OverflowError (math.isfinite of an int past a float)."""
    adir = forged(tmp_path, habits={"rank-0": {"count": 10**400, "first": 0, "last": 1, "gap": 0},
                                    "rank-1": {"count": 5, "first": -1e308, "last": 1e308,
                                               "gap": -1}})  # fmt: skip
    assert diagnosed(adir)["rank"] in (None, 0, 1)
    assert all(len(ln) < 400 for ln in dhang.hang_lines(adir))


JSONS = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c,
                                                                          max_size=4),
                     max_leaves=12)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["detected_at", "last_progress", "hang_timeout",
                                        "action", "expected", "stacks", "habits"]), JSONS))  # fmt: skip
def test_any_hang_json_reads(fields: dict) -> None:
    """Whatever JSON a rank puts in hang.json: no exception, the silences finite."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        adir = forged(Path(tmp), **fields)
        diagnosed(adir)
        dhang.hang_lines(adir)
        dhang.warned_lines(str(adir.parent), 0)
        assert all(r.silent is None or math.isfinite(r.silent) for r in dhang.read(adir).ranks)


@pytest.mark.parametrize("name", ["rank-\u00b2", "rank-7", "rank-x", "rank-" + "9" * 200,
                                  "node-\u0663"])  # fmt: skip
def test_a_stack_file_of_no_rank_of_the_attempt_is_not_read(tmp_path: Path, name: str) -> None:
    """A rank wrote stacks/<name>.txt, a stopped stack with a later request id, which the
    watch counted as answered. Before: ValueError from sorting `rank-²` (the supervisor
    died, the run LOST), or the rank that is not one (rank 7) blamed."""
    files = {0: stack("all_reduce", 14), 1: stack("all_reduce", 14)}
    adir = attempt(tmp_path, TRAINER, files)
    (adir / "stacks" / f"{name}.txt").write_text(stack("all_reduce", 14, stopped=True))
    info = json.loads((adir / "hang.json").read_text())
    info["stacks"].append(name)
    (adir / "hang.json").write_text(json.dumps(info))
    h = dhang.read(adir)
    assert [r.name for r in h.ranks] == ["rank-0", "rank-1"], h.line
    assert diagnosed(adir)["rank"] is None
    assert "stopped" not in h.line


def test_the_rank_in_the_collective_is_not_blamed_when_two_are_outside(tmp_path: Path) -> None:
    """Three ranks: ranks 1 and 2 sleep at the same line, rank 0 waits for them in
    all_reduce. Before: 'hang on rank 0' (its stack was the one that differed)."""
    habits = {0: TRAINER[0], 1: TRAINER[1], 2: TRAINER[1]}
    files = {0: stack("all_reduce", 14), 1: stack("sleep", 12), 2: stack("sleep", 12)}
    adir = attempt(tmp_path, habits, files)
    assert diagnosed(adir)["rank"] != 0
    four = attempt(tmp_path / "four", {**habits, 3: TRAINER[1]},
                   {**files, 3: stack("all_reduce", 14)})  # fmt: skip
    assert diagnosed(four)["rank"] not in (0, 3)
    # a rank alone in a different collective is still named (all_gather among all_reduce)
    odd = attempt(tmp_path / "odd", habits,
                  {0: stack("all_reduce", 14), 1: stack("all_reduce", 14),
                   2: stack("all_gather", 20)})  # fmt: skip
    assert diagnosed(odd)["rank"] == 2


def test_a_stack_file_of_a_huge_sparse_size_is_read_bounded(tmp_path: Path) -> None:
    """A rank truncates its stack file to 64 GiB (sparse: no disk). Before: read whole."""
    adir = attempt(tmp_path, TRAINER, {0: stack("sleep", 12), 1: stack("all_reduce", 14)})
    with open(adir / "stacks" / "rank-1.txt", "r+b") as fh:
        fh.truncate(64 << 30)
    h = dhang.read(adir)
    assert [r.name for r in h.ranks] == ["rank-0", "rank-1"]


def test_a_user_frame_in_a_huge_file_is_read_bounded(tmp_path: Path) -> None:
    """The user frame's file is a 64 GiB sparse file without a line end: the call on its
    line is looked up within a bound. Before: the whole file read as one line."""
    big = tmp_path / "train.py"
    with open(big, "wb") as fh:
        fh.truncate(64 << 30)
    text = stack("sleep", 12).replace("/venv/lib/python3.11/site-packages/torch/x.py", str(big))
    adir = attempt(tmp_path, TRAINER, {0: text, 1: stack("all_reduce", 14)})
    assert dhang.read(adir).ranks[0].what  # no MemoryError, in bounded time


def test_every_rank_stopped_is_said_stopped(tmp_path: Path) -> None:
    """Both ranks SIGSTOPped (a debugger on the job, `kill -STOP` of its group): no rank
    is named, and the line says they are stopped. Before: 'all 2 ranks wait in all_gather
    (train.py:78)', the stop unsaid (the first group never said its state)."""
    files = {0: stack("all_gather", 78, stopped=True), 1: stack("all_gather", 78, stopped=True)}
    adir = attempt(tmp_path, TRAINER, files)
    assert dhang.read(adir).line == (
        "hang: all 2 ranks wait in all_gather (train.py:78), stopped (SIGSTOP or a debugger)"
    )
    assert diagnosed(adir)["rank"] is None
    files = {0: stack("sleep", 59, stopped=True), 1: stack("all_gather", 77, stopped=True)}
    adir = attempt(tmp_path / "apart", TRAINER, files)
    assert dhang.read(adir).line.startswith(
        "hang: rank 1 waits in all_gather (train.py:77), stopped (SIGSTOP or a debugger); "
        "rank 0 is in sleep (train.py:59), stopped"
    )
    assert diagnosed(adir)["rank"] == 0
