"""Issue 38 item 3: who is blamed for a hang. Silence judged against each rank's own pace
(recorded timelines: hang.json `habits`, as the hang watch keeps them), the rank the stacks
show stuck (a stopped one, the one outside a collective), and py-spy's own reason when it
could not read a process (real py-spy on real processes: a stopped one, a gone one, a
non-Python one)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import needs_program
from trebuchet.diagnose import hang as dhang
from trebuchet.runtime.process import procs
from trebuchet.runtime.watch import hung as hang
from trebuchet.runtime.watch import stacks
from trebuchet.runtime.watch.display_lines import shown

PY = sys.executable
NOW = 1_800_000_000.0

NO_SPY = """\
# request 1.0-1 method none pid 12
# host tn1
# tried: py-spy not found (install py-spy on the nodes)
# no stacks: py-spy was not usable and faulthandler not registered
"""


def stack(inner: str, line: int, native: str = "", stopped: bool = False) -> str:
    """A py-spy dump of a rank of train.py whose innermost Python frame is `inner`."""
    head = "# request 1.0-1 method py-spy pid 10\n# host tn1\n"
    head += "# state stopped\n" if stopped else ""
    frames = f"    {native} (libtorch_cpu.so)\n" if native else ""
    return (f"{head}Thread 10 (idle): \"MainThread\"\n{frames}"
            f"    {inner} (/venv/lib/python3.11/site-packages/torch/x.py:5)\n"
            f"    train (/work/train.py:{line})\n    <module> (/work/train.py:120)\n")  # fmt: skip


def paced(count: int, first: float, last: float, gap: float | None) -> dict:
    return {"count": count, "first": first, "last": last, "gap": gap}


def attempt(tmp_path: Path, habits: dict[int, dict] | None, files: dict[int, str]) -> Path:
    """An attempt stopped for a hang detected at NOW, 10 s after the last progress."""
    adir = tmp_path / "attempt-0"
    (adir / "stacks").mkdir(parents=True)
    for r, text in files.items():
        (adir / "stacks" / f"rank-{r}.txt").write_text(text)
    info = {"detected_at": NOW, "last_progress": NOW - 10.0, "hang_timeout": 10.0,
            "action": "fail", "expected": [f"rank-{r}" for r in sorted(files)],
            "stacks": [f"rank-{r}" for r in sorted(files)], "attempt_dir": str(adir)}  # fmt: skip
    if habits is not None:
        info["habits"] = {f"rank-{r}": h for r, h in habits.items()}
        (adir / "progress").mkdir()
        for r, h in habits.items():  # the progress files say the same
            (adir / "progress" / f"rank-{r}").write_text("x\n")
            os.utime(adir / "progress" / f"rank-{r}", (h["last"], h["last"]))
    (adir / "hang.json").write_text(json.dumps(info))
    return adir


def blamed(adir: Path) -> int | None:
    found = dhang.for_run({"run_dir": str(adir.parent), "attempt": 0, "state": "FAILED"})
    assert found is not None
    return found["rank"]


# The HF Trainer, as the issue saw it: rank 0 logs every second for 60 s; rank 1 printed
# two warnings at its start and never again (34 s before the hang was seen).
TRAINER = {0: paced(60, NOW - 70.0, NOW - 10.0, 1.0), 1: paced(2, NOW - 35.0, NOW - 34.0, 1.0)}


def test_a_rank_that_never_prints_is_not_silent_first(tmp_path: Path) -> None:
    """Before: 'rank 1 went silent first, 34s before the hang was seen' and rank 1 blamed."""
    adir = attempt(tmp_path, TRAINER, dict.fromkeys(range(2), NO_SPY))
    h = dhang.read(adir)
    assert "went silent first" not in h.line, h.line
    assert h.line == "hang: no stacks on tn1: py-spy not found there"
    assert blamed(adir) is None


def test_a_rank_that_printed_only_at_its_start_is_not_silent_first(tmp_path: Path) -> None:
    """A rank that beat every second while it imported (10 s) and then stayed quiet for
    the 40 s that rank 0 trained: its silence is its habit since, not the hang's cause."""
    habits = {0: paced(50, NOW - 60.0, NOW - 10.0, 1.0), 1: paced(10, NOW - 60.0, NOW - 50.0, 1.0)}
    adir = attempt(tmp_path, habits, dict.fromkeys(range(2), NO_SPY))
    assert "went silent first" not in dhang.read(adir).line
    assert blamed(adir) is None


def test_a_slow_printer_within_its_pace_is_not_silent_first(tmp_path: Path) -> None:
    """Rank 1 prints every 20 s (an eval line) and last did 15 s before the others stopped."""
    habits = {0: paced(100, NOW - 110.0, NOW - 10.0, 1.0),
              1: paced(5, NOW - 110.0, NOW - 25.0, 20.0)}  # fmt: skip
    adir = attempt(tmp_path, habits, dict.fromkeys(range(2), NO_SPY))
    assert "went silent first" not in dhang.read(adir).line
    assert blamed(adir) is None


def test_a_paced_rank_that_stopped_first_is_still_named(tmp_path: Path) -> None:
    """No regression: both ranks print every step; rank 1 stopped 6 s before rank 0."""
    habits = {0: paced(60, NOW - 70.0, NOW - 10.0, 1.0), 1: paced(54, NOW - 70.0, NOW - 16.0, 1.0)}
    adir = attempt(tmp_path, habits, dict.fromkeys(range(2), NO_SPY))
    assert dhang.read(adir).line == (
        "hang: no stacks on tn1: py-spy not found there; rank 1 went silent first, 16s "
        "before the hang was seen (the others 10s or less)"
    )
    assert blamed(adir) == 1


def test_older_hang_files_without_habits_keep_the_old_rule(tmp_path: Path) -> None:
    adir = attempt(tmp_path, None, dict.fromkeys(range(2), NO_SPY))
    (adir / "progress").mkdir()
    for r, age in ((0, 10.0), (1, 16.0)):
        (adir / "progress" / f"rank-{r}").write_text("x\n")
        os.utime(adir / "progress" / f"rank-{r}", (NOW - age, NOW - age))
    assert "rank 1 went silent first, 16s" in dhang.read(adir).line
    assert blamed(adir) == 1


def test_the_stopped_rank_is_named_even_where_both_wait_in_a_collective(tmp_path: Path) -> None:
    """`treb fault RUN hang-rank 0` under the Trainer: rank 0 stopped inside all_gather,
    rank 1 waits in DDP's reducer. Before: 'hang on rank 1' (rank 1's stack was the odd
    one, and it was silent longest)."""
    files = {0: stack("all_gather", 78, stopped=True),
             1: stack("_engine_run_backward", 78, "c10d::Reducer::finalize_backward")}  # fmt: skip
    adir = attempt(tmp_path, TRAINER, files)
    h = dhang.read(adir)
    assert h.line == (
        "hang: rank 1 waits in _engine_run_backward (train.py:78) [native: "
        "c10d::Reducer::finalize_backward]; rank 0 is in all_gather (train.py:78), stopped "
        "(SIGSTOP or a debugger), silent for 10s"
    )
    assert blamed(adir) == 0
    same = attempt(tmp_path / "same", TRAINER,
                   {0: stack("all_gather", 78, stopped=True), 1: stack("all_gather", 78)})  # fmt: skip
    assert dhang.read(same).line == (
        "hang: rank 1 waits in all_gather (train.py:78); rank 0 is in all_gather "
        "(train.py:78), stopped (SIGSTOP or a debugger), silent for 10s"
    )
    assert blamed(same) == 0


def test_the_rank_outside_the_collective_is_named_among_two(tmp_path: Path) -> None:
    """Rank 0 sleeps in a Trainer callback, rank 1 waits in all_gather. Before: '1 of 2
    ranks wait in time.sleep; rank 1 is in all_gather' and rank 1 blamed."""
    files = {0: stack("sleep", 59), 1: stack("all_gather", 77)}
    adir = attempt(tmp_path, TRAINER, files)
    assert dhang.read(adir).line == (
        "hang: rank 1 waits in all_gather (train.py:77); rank 0 is in sleep (train.py:59), "
        "silent for 10s"
    )
    assert blamed(adir) == 0


def test_planted_habits_are_no_habits(tmp_path: Path) -> None:
    """hang.json is in a folder ranks can write: habits of any shape are judged as none
    (no traceback), and the silence comes from the progress files then."""
    junk = {0: {"count": "60", "first": None, "last": True, "gap": [1]}, 1: {"last": 1e400}}
    adir = attempt(tmp_path, {0: TRAINER[0], 1: TRAINER[1]}, dict.fromkeys(range(2), NO_SPY))
    info = json.loads((adir / "hang.json").read_text())
    info["habits"] = {"rank-0": junk[0], "rank-1": junk[1], "rank-2": "x", "rank-3": [1, 2]}
    (adir / "hang.json").write_text(json.dumps(info))
    h = dhang.read(adir)
    assert h.line == "hang: no stacks on tn1: py-spy not found there"
    assert [round(r.silent or 0) for r in h.ranks] == [10, 34]  # the progress files'
    assert blamed(adir) is None


HABIT = st.fixed_dictionaries({
    "count": st.integers(0, 500), "first": st.floats(NOW - 1e5, NOW - 10.0),
    "last": st.floats(NOW - 1e5, NOW - 10.0),
    "gap": st.one_of(st.none(), st.floats(0.0, 1e4))})  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from([f"rank-{r}" for r in range(6)]), HABIT, min_size=1))
def test_a_rank_is_named_silent_first_only_against_its_own_pace(habits: dict) -> None:
    """Whatever the timelines: the rank named printed HABIT_EVENTS times or more, for at
    least as long as it was then quiet, and was quiet past its own gap; a rank that
    printed fewer times is never named."""
    silence = {n: NOW - h["last"] for n, h in habits.items()}
    first = dhang.first_silent(silence, habits)
    if first is None:
        return
    h = habits[first[0]]
    end = max(x["last"] for x in habits.values())
    assert h["count"] >= dhang.HABIT_EVENTS and h["gap"] is not None
    assert end - h["last"] >= max(dhang.SILENT_GAP_S, dhang.HABIT_FACTOR * h["gap"])
    assert h["last"] - h["first"] >= end - h["last"]


def test_the_watch_keeps_each_ranks_habit_in_hang_json(tmp_path: Path) -> None:
    """The habits come from what the watch saw once a second: rank 0 advanced 3 times,
    rank 1 once; the median gap of rank 0's times."""
    adir = tmp_path / "attempt-0"
    (adir / "progress").mkdir(parents=True)
    habits = hang.Habits()
    for t0, t1 in ((100.0, 100.0), (101.0, 100.0), (103.0, 100.0), (103.0, 100.0)):
        habits.update({"rank-0": t0, "rank-1": t1})
    rec = habits.record()
    assert rec["rank-0"] == {"count": 3, "first": 100.0, "last": 103.0, "gap": 2.0}
    assert rec["rank-1"] == {"count": 1, "first": 100.0, "last": 100.0, "gap": None}
    (adir / "progress" / "rank-0").write_text("x\n")
    os.utime(adir / "progress" / "rank-0", (time.time() - 60, time.time() - 60))
    # no stack files expected: the watch decides once it sees the hang, without the wait
    watch = hang.HangWatch(str(adir), 1.0, "fail", [], started=time.time() - 60)
    deadline = time.monotonic() + 30
    info = None
    while info is None and time.monotonic() < deadline:
        info = watch.step()
        time.sleep(0.05)
    assert info is not None
    assert json.loads((adir / "hang.json").read_text())["habits"]["rank-0"]["count"] == 1


# -- py-spy: a stopped process, and its own reason when it cannot read one --------------

SUSPEND_FAILED = """\
Process 24839: /venv/bin/python train.py
Python v3.11.7 (/usr/bin/python3.11)

Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: unexpected waitpid result PtraceEvent(Pid(24839), SIGSTOP, 128) to 24839

Stack backtrace:
   0: anyhow::error::<impl anyhow::Error>::msg
   1: py_spy::python_spy::PythonSpy::get_stack_traces
   9: std::rt::lang_start_internal
  10: main
"""


def test_py_spy_reason_is_its_error_not_the_backtrace() -> None:
    """Before: '   10: main' (the last line of the Rust backtrace)."""
    assert stacks.pyspy_reason(SUSPEND_FAILED) == (
        "Failed to get stack traces: Failed to suspend process: unexpected waitpid result "
        "PtraceEvent(Pid(24839), SIGSTOP, 128) to 24839"
    )
    gone = ("Error: Failed to get process executable name. Check that the process is running."
            "\n\nCaused by:\n    0: No such file or directory (os error 2)\n"
            "    1: No such file or directory (os error 2)\n")  # fmt: skip
    assert stacks.pyspy_reason(gone) == ("Failed to get process executable name. Check that "
                                         "the process is running.: No such file or directory "
                                         "(os error 2)")  # fmt: skip
    assert stacks.pyspy_reason("Permission Denied: Try running again\n") == (
        "Permission Denied: Try running again"
    )
    assert stacks.pyspy_reason("") == ""


LINE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).filter(
    lambda s: "\n" not in s and "\r" not in s)  # fmt: skip
SAID = LINE.map(str.strip).filter(
    lambda s: bool(s) and s.isprintable() and s.splitlines() == [s] and s[:6].lower() != "error:"
    and s != "Caused by:" and not s.startswith("Stack backtrace:")
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.lists(LINE, max_size=8), SAID, st.lists(SAID, max_size=4), st.booleans())
def test_py_spy_reason_properties(before: list, error: str, causes: list, trace: bool) -> None:
    """Any output: one line as the views show text (runtime/watch/display_lines.shown), at most
    REASON_MAX. py-spy's error form: its error and causes joined, whatever came before it
    and whether a backtrace follows."""
    text = "\n".join(before) + f"\nError: {error}\n"
    if causes:
        text += "\nCaused by:\n" + "".join(f"    {i}: {c}\n" for i, c in enumerate(causes))
    if trace:
        text += "\nStack backtrace:\n   0: anyhow::msg\n  10: main\n"
    said = stacks.pyspy_reason(text)
    parts = [error]
    for c in causes:
        if c != parts[-1]:
            parts.append(c)
    assert said == ": ".join(parts)[: stacks.REASON_MAX]
    for junk in ("\n".join(before), "\n".join(before) + "\x1b]0;x\x07\n\u2028"):
        got = stacks.pyspy_reason(junk)
        assert shown(got) == got and len(got) <= stacks.REASON_MAX, got
        assert "\n" not in got and "\x1b" not in got and "\u2028" not in got


def dump(adir: Path, pid: int) -> str:
    """A real Dump of `pid` (py-spy from this venv), to its end; the file's text."""
    d = stacks.Dump(str(adir), "rank-0", pid, "1.0-1")
    deadline = time.monotonic() + 30
    while not d.step():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return (adir / "stacks" / "rank-0.txt").read_text()


@pytest.fixture
def spy(monkeypatch) -> None:
    monkeypatch.delenv("TREB_PY_SPY", raising=False)
    monkeypatch.setenv("TREB_PY_SPY", stacks.find_py_spy() or needs_program("py-spy"))
    monkeypatch.setenv("RUST_BACKTRACE", "1")  # as on this machine: py-spy then adds one


def test_a_stopped_process_is_read_and_said_stopped(tmp_path: Path, spy) -> None:
    (tmp_path / "stacks").mkdir()
    code = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.1)"
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not procs.stopped(proc.pid):  # the stop is delivered a moment later
            assert time.monotonic() < deadline
            time.sleep(0.01)
        text = dump(tmp_path, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    head = text.splitlines()
    assert " method py-spy --nonblocking " in head[0], text
    assert not any(ln.startswith("# tried:") for ln in head), text  # read at once
    assert "# state stopped" in head, text
    [rs] = dhang.read_stacks(tmp_path)
    assert rs.stopped and rs.what != "no Python frames", text


@pytest.mark.parametrize("target", ["gone", "not-python"])
def test_a_failed_dump_says_py_spy_s_reason(tmp_path: Path, spy, target: str) -> None:
    """Before: the last line of py-spy's output ('   10: main' of its backtrace)."""
    (tmp_path / "stacks").mkdir()
    proc = subprocess.Popen(["sleep", "120"])
    if target == "gone":
        proc.kill()
        proc.wait()
    try:
        text = dump(tmp_path, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    tried = [ln for ln in text.splitlines() if ln.startswith("# tried: py-spy")]
    assert tried and not any("main" in t.split(": ", 2)[-1] for t in tried), text
    want = ("Failed to get process executable name" if target == "gone"
            else "Failed to find python version from target process")  # fmt: skip
    assert all(want in t for t in tried), text
    [rs] = dhang.read_stacks(tmp_path)
    assert rs.method == "none" and want in rs.why
