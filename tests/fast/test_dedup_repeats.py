"""`treb logs --dedup` over a text one rank repeats (issue 33): each line found its group
by walking every open group of its text, so 40k identical lines took 14 s (quadratic).
The work is counted as the Python lines dedup.py executes (sys.settrace): deterministic,
no clock; four times the lines may cost about four times the work, not sixteen."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from trebuchet.view import dedup


def _written(tmp_path: Path, logs: dict[int, list[str]]) -> list[str]:
    files = []
    for rank, lines in logs.items():
        path = tmp_path / f"rank-{rank}.log"
        path.write_text("".join(f"{ln}\n" for ln in lines))
        files.append((path, 0))
    out = io.BytesIO()
    dedup.written(out, files)
    return out.getvalue().decode().splitlines()


def test_40k_identical_lines_of_one_rank(tmp_path: Path) -> None:
    shown = _written(tmp_path, {0: ["same line"] * 40_000, 1: ["other"]})
    assert shown.count("[0] same line") == 40_000 and shown.count("[1] other") == 1
    assert len(shown) == 40_001


def test_repeats_of_two_ranks_pair_up_in_order(tmp_path: Path) -> None:
    """The k-th copy of a text in each rank goes together, however many are open."""
    logs = {0: ["same"] * 20_000, 1: ["same"] * 20_000 + ["late"], 2: ["other"] * 3}
    shown = _written(tmp_path, logs)
    assert shown.count("[0-1] same") == 20_000 and shown.count("[2] other") == 3
    assert shown.count("[1] late") == 1 and len(shown) == 20_004
    d = dedup.Dedup(io.BytesIO(), ["0", "1", "2"], window=None)  # rank 1 catches up later
    for _ in range(3000):
        d.add("0", [b"x"], 0.0)
    for _ in range(3000):
        d.add("1", [b"x"], 0.0)
    d.add("2", [b"x"], 0.0)
    d.flush(0.0, final=True)
    out = d.out.getvalue().decode().splitlines()  # type: ignore[attr-defined]
    assert out == ["[0-2] x"] + ["[0-1] x"] * 2999


def _work(n: int) -> int:
    """Lines of dedup.py executed to group `n` copies of one text of rank 0 while rank 1
    prints nothing (so every group stays open)."""
    count = 0
    here = dedup.__file__

    def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        nonlocal count
        count += event == "line"
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        return local if frame.f_code.co_filename == here else None

    d = dedup.Dedup(io.BytesIO(), ["0", "1"], window=None)
    sys.settrace(calls)
    try:
        for _ in range(n):
            d.add("0", [b"same line"], 0.0)
    finally:
        sys.settrace(None)
    return count


def test_grouping_repeats_is_linear() -> None:
    small, large = _work(500), _work(2000)
    assert large <= 5 * small, (small, large)  # quadratic: ~16 times
