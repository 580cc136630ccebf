"""Stragglers (runtime/watch/straggler.py) and checkpoints announced by a log line
(runtime/watch/marks.py LineCheckpoints): the scorer over any step times, the watch over
real marks files as ranks write them, the trainers' real checkpoint lines."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.cli.main import main
from trebuchet.goodput.timeline import load
from trebuchet.runtime.watch import straggler
from trebuchet.runtime.watch.marks import (
    DEFAULT_CHECKPOINT_PATTERN,
    LineCheckpoints,
    attempt_marks,
    checkpoint_lines,
    progressed,
)
from trebuchet.runtime.watch.straggler import StragglerWatch, named, score

TRAINERS = Path(__file__).resolve().parent.parent / "fixtures" / "trainers"

ANY_TIME = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e12, max_value=1e12),
    st.floats(min_value=0, max_value=1e-9),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([str(r) for r in range(8)]),
                       st.lists(ANY_TIME, max_size=30), max_size=8))  # fmt: skip
def test_any_step_times_give_finite_scores(times: dict[str, list[float | None]]) -> None:
    """NaN, inf, negative, huge or missing times are ignored: every score is finite and
    positive, for ranks given only, and a named rank is a scored one."""
    scores = score(times)
    assert set(scores) <= set(times)
    assert all(math.isfinite(s) and s > 0 for s in scores.values()), scores
    assert set(named(times, 1.3)) <= set(scores)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 16), st.integers(0, 2**32 - 1), st.floats(1e-4, 100.0))
def test_an_even_run_names_nobody_and_a_rank_half_again_as_slow_is_named(
    ranks: int, seed: int, base: float
) -> None:
    """Jitter of +-10 % on every rank (any step length, from 0.1 ms to 100 s): nobody
    reaches 1.3 (1.1 / 0.9 at worst); one rank 1.5x as slow, with +-5 % (1.5 * 0.95 / 1.05
    at worst), is named after MIN_STEPS steps, and only it."""
    rng = random.Random(seed)
    jitter = [[base * rng.uniform(0.9, 1.1) for _ in range(20)] for _ in range(ranks)]
    even = {str(r): jitter[r] for r in range(ranks)}
    assert named(even, 1.3) == {}
    slow = rng.randrange(ranks)
    times = {str(r): [base * rng.uniform(0.95, 1.05) * (1.5 if r == slow else 1.0)
                      for _ in range(20)] for r in range(ranks)}  # fmt: skip
    early = {r: ts[: straggler.MIN_STEPS] for r, ts in times.items()}
    if base >= 0.01:  # past the millisecond noise floor: 1.5x reads as more than 1.3x
        assert list(named(early, 1.3)) == [str(slow)]
    assert list(named({r: ts[:4] for r, ts in times.items()}, 1.3)) == []  # too few yet


def lockstep(folder: Path, ranks: int, steps: range, slow: int | None, *, compute: bool = True,
             base: float = 0.1, start: float = 1000.0) -> float:  # fmt: skip
    """Ranks in lockstep as `trebuchet.dist.mark` writes them: each computes (rank `slow`
    for 1.5x as long), marks its arrival, waits for the slowest at the all-reduce (5 ms),
    marks the step. Appends to the marks files; returns the last step's end."""
    marks = folder / "marks"
    marks.mkdir(parents=True, exist_ok=True)
    rng = random.Random(steps.start)
    t = start
    for n in steps:
        took = [base * rng.uniform(0.95, 1.05) * (1.5 if r == slow else 1.0) for r in range(ranks)]
        end = t + max(took) + 0.005
        for r in range(ranks):
            with open(marks / f"rank-{r}", "a") as fh:
                if compute:
                    fh.write(f"{t + took[r]:.6f} compute {n}\n")
                fh.write(f"{end:.6f} step {n}\n")
        t = end
    return t


def test_the_watch_names_a_slowed_rank_within_20_steps_once(tmp_path: Path) -> None:
    """Rank 2 of 4 takes 1.5x as long: named at the first check that has MIN_STEPS steps
    (the watch reads what was appended since), one event's fields with its node and host,
    not again while it stays slow; stragglers.json has every rank's and node's score."""
    w = StragglerWatch(str(tmp_path), 1.3, 2)
    t, found, at = 1000.0, [], None
    for chunk in range(10):  # 2 steps appended between checks
        t = lockstep(tmp_path, 4, range(2 * chunk, 2 * chunk + 2), 2, start=t)
        new = w.check(force=True)
        if new and at is None:
            at = 2 * chunk + 2
        found += new
    assert at is not None and at <= 20
    assert [(f["rank"], f["node"]) for f in found] == [(2, 1)]
    assert found[0]["host"] == os.uname().nodename and found[0]["score"] >= 1.3
    data = json.loads((tmp_path / "stragglers.json").read_text())
    assert data["stragglers"] == ["2"] and set(data["ranks"]) == {"0", "1", "2", "3"}
    assert data["nodes"]["1"] == data["ranks"]["2"] and data["nodes"]["0"] < 1.3
    # after the fact, from the files alone: the same
    again = straggler.Folder(str(tmp_path)).read()
    assert straggler.report(again, 1.3, 2)["stragglers"] == ["2"]


def test_an_even_run_of_200_steps_names_nobody(tmp_path: Path) -> None:
    w = StragglerWatch(str(tmp_path), 1.3, 2)
    t = 1000.0
    for chunk in range(20):
        t = lockstep(tmp_path, 4, range(10 * chunk, 10 * chunk + 10), None, start=t)
        assert w.check(force=True) == []
    assert json.loads((tmp_path / "stragglers.json").read_text())["stragglers"] == []


def test_step_ends_alone_cannot_show_a_lockstep_straggler(tmp_path: Path) -> None:
    """The documented limit: without `compute` marks, every rank's step ends together
    (the collective waits for the slowest), so nobody is named, slow rank or not."""
    lockstep(tmp_path, 2, range(30), 1, compute=False)
    assert straggler.report(straggler.Folder(str(tmp_path)).read(), 1.3, 1)["stragglers"] == []


def test_ranks_that_do_not_wait_are_read_from_their_own_steps_and_log_lines(
    tmp_path: Path,
) -> None:
    """Without a collective, a rank's own step intervals show it: from its step marks,
    or from its metrics points (`metrics: {ranks: all}`) when it marks nothing."""
    (tmp_path / "metrics").mkdir()
    for r in range(3):
        with open(tmp_path / "metrics" / f"rank-{r}.jsonl", "w") as fh:
            for n in range(12):
                fh.write(json.dumps({"t": 1000 + n * (3.0 if r == 0 else 2.0), "s": n,
                                     "m": {"loss": 1.0}}) + "\n")  # fmt: skip
    assert straggler.report(straggler.Folder(str(tmp_path)).read(), 1.3, 1)["stragglers"] == ["0"]


def test_hostile_marks_files_give_scores_or_nothing(tmp_path: Path) -> None:
    """NUL, ESC, a lone surrogate, a line cut in two, a huge line, a FIFO, nonsense
    numbers: the watch goes on, and the ranks' real marks still count."""
    marks = tmp_path / "marks"
    lockstep(tmp_path, 2, range(12), 1)
    with open(marks / "rank-0", "ab") as fh:
        fh.write(b"\x00\x1b]0;x\x07 compute 3\n" + "\ud800".encode("utf-8", "surrogatepass")
                 + b"\n1e999 compute 9\nnan step nan\n-5 compute 1\n" + b"9" * 100000
                 + b"\n1012.5 compu")  # fmt: skip
    os.mkfifo(marks / "rank-7")
    (marks / "rank-x").write_text("1 compute 1\n")
    w = StragglerWatch(str(tmp_path), 1.3, 1)
    assert [f["rank"] for f in w.check(force=True)] == [1]


def test_dist_mark_compute_and_torchrun_workers_each_their_own_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trebuchet.dist import mark

    monkeypatch.setenv("TREB_MARKS", str(tmp_path / "node-0"))  # torchrun: a node's file
    monkeypatch.setenv("RANK", "3")
    mark("compute", 7)
    mark("bogus", 1)
    words = (tmp_path / "rank-3").read_text().split()
    assert words[1:] == ["compute", "7"] and not (tmp_path / "node-0").exists()


# -- checkpoints announced by a log line ----------------------------------------------------
@pytest.mark.parametrize("log, numbers", [
    ("transformers-5.25.0-no-tqdm.log", [10.0, 20.0, 30.0]),
    ("transformers-5.25.0-no-tqdm-resumed.log", [40.0, 50.0, 60.0]),
    ("transformers-4.57.6-no-tqdm.log", [10.0, 20.0, 30.0]),
    ("transformers-5.25.0-tqdm-resumed.log", []),  # "missing keys in the checkpoint": none
    ("lightning-2.6.6-tqdm.log", []),
])  # fmt: skip
def test_trainers_checkpoint_lines_are_checkpoint_marks(
    tmp_path: Path, log: str, numbers: list[float]
) -> None:
    """The real lines of the HuggingFace Trainer ("Saving model checkpoint to
    .../checkpoint-30") are checkpoints numbered by their step; a resumed run's "Loading
    model from .../checkpoint-30" and "Resuming training from checkpoint" are not."""
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    hook = checkpoint_lines(str(adir), {})
    assert hook is not None
    for line in (TRAINERS / log).read_bytes().replace(b"\r", b"\n").split(b"\n"):
        hook("rank-0", line)
    found = [m for m in attempt_marks(str(adir)) if m.kind == "checkpoint"]
    assert [m.n for m in found] == numbers


def test_other_trainers_lines_and_a_specs_own_pattern(tmp_path: Path) -> None:
    """Lightning's ModelCheckpoint (verbose), Megatron-LM, DeepSpeed: checkpoints with
    their step; a spec's pattern with a `step` group replaces the default; "" is off."""
    hook = LineCheckpoints(str(tmp_path), DEFAULT_CHECKPOINT_PATTERN)
    for line in [
        b"Epoch 0, global step 50: 'val_loss' reached 0.52118 (best 0.52118), saving model to "
        b"'/ckpt/epoch=0-step=50.ckpt' as top 1",
        b" successfully saved checkpoint from iteration     100 to /ckpt [ t 1/1, p 1/1 ]",
        b"[2026-01-01 10:00:00,000] [INFO] [engine.py:3597:_save_zero_checkpoint] "
        b"[Torch] Checkpoint global_step150 is ready now!",
        b"loss=0.3 checkpoint of the optimizer loaded",
    ]:
        hook("rank-0", line)
    assert [m.n for m in attempt_marks(str(tmp_path))] == [50, 100, 150]
    own = checkpoint_lines(str(tmp_path / "own"), {"checkpoint_pattern": r"SAVED @(?P<step>\d+)"})
    assert own is not None
    own("rank-0", b"SAVED @70")
    assert [m.n for m in attempt_marks(str(tmp_path / "own"))] == [70]
    assert checkpoint_lines(str(tmp_path), {"checkpoint_pattern": ""}) is None


def test_a_logged_checkpoint_counts_for_goodput_and_progress(tmp_path: Path) -> None:
    """A failed attempt that only printed its checkpoint line: the training up to it is
    kept (goodput), and the attempt made progress (the no-progress rule)."""
    run = tmp_path / "run"
    adir = run / "attempt-0"
    adir.mkdir(parents=True)
    (adir / "marks").mkdir()
    (adir / "marks" / "rank-0").write_text("100 step 1\n110 step 2\n")
    LineCheckpoints(str(adir), DEFAULT_CHECKPOINT_PATTERN)(
        "rank-0", b"Saving model checkpoint to /c/checkpoint-2"
    )
    assert progressed(str(run), 0, 100.0) is True
    tl = load(run, "r", [{"time": 90, "event": "submitted"},
                         {"time": 100, "event": "attempt_started", "attempt": 0}])  # fmt: skip
    assert len(tl.attempts[0].checkpoints) == 1


@pytest.mark.parametrize("field, value, words", [
    ("checkpoint_pattern", "'(unclosed'", "checkpoint_pattern"),
    ("straggler_threshold", "0.9", "straggler_threshold: must be a number above 1, or 0"),
    ("straggler_threshold", "yes", "straggler_threshold"),
    ("straggler_threshold", ".nan", "straggler_threshold"),
])  # fmt: skip
def test_bad_settings_exit_2_naming_the_field(
    tmp_path: Path, treb_home: Path, capsys: pytest.CaptureFixture[str], field: str,
    value: str, words: str,
) -> None:  # fmt: skip
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: x\n{field}: {value}\n")
    assert main(["render", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:2:" in err and words in err and "Traceback" not in err, err


def test_the_dashboard_and_status_name_it_after_the_fact(tmp_path: Path) -> None:
    """No stragglers.json (an ssh run whose marks were fetched, a run before the watch):
    the run page and `status` compute it from the marks; a host name with markup stays
    text; a run whose ranks marked nothing shows nothing."""
    from trebuchet.cli.report import straggler_json
    from trebuchet.store.db import RunRecord
    from trebuchet.ui.pages import _stragglers

    run = tmp_path / "run"
    lockstep(run / "attempt-0", 2, range(12), 1)
    (run / "attempt-0" / "rank-1.json").write_text(json.dumps(
        {"label": "rank-1", "rank": 1, "node": 0, "host": "<b>gpu-17</b>",
         "state": "RUNNING"}))  # fmt: skip
    rec = RunRecord(id="r1", name="x", backend="local", launcher="native", state="RUNNING",
                    nodes=1, procs_per_node=2, run_dir=str(run), created_at=0.0)  # fmt: skip
    html = _stragglers(rec)
    assert "straggler: rank 1 (node 0, &lt;b&gt;gpu-17&lt;/b&gt;) takes 1." in html, html
    data = straggler_json(rec)
    assert data is not None and [s["rank"] for s in data["stragglers"]] == [1]
    assert not (run / "attempt-0" / "stragglers.json").exists()  # a view writes nothing
    empty = tmp_path / "empty"
    (empty / "attempt-0").mkdir(parents=True)
    rec2 = RunRecord(id="r2", name="x", backend="local", launcher="native", state="RUNNING",
                     nodes=1, procs_per_node=2, run_dir=str(empty), created_at=0.0)  # fmt: skip
    assert _stragglers(rec2) == "" and straggler_json(rec2) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=2, max_size=40))
def test_the_peers_median_is_the_median_of_the_others(values: list[float]) -> None:
    """The O(1) leave-one-out median equals the plain one, for every rank."""
    s = sorted(values)
    for at in range(len(s)):
        assert straggler._median_without(s, at) == straggler._median(s[:at] + s[at + 1 :])


def test_step_numbers_used_again_follow_the_order_they_were_marked(tmp_path: Path) -> None:
    """A new epoch numbering its steps from 0 again: the latest marks are the steps, and
    the slowed rank is named from them, not from the old epoch's higher numbers."""
    t = lockstep(tmp_path, 3, range(30), None)
    lockstep(tmp_path, 3, range(8), 0, start=t + 1)
    w = StragglerWatch(str(tmp_path), 1.3, 1)
    assert [f["rank"] for f in w.check(force=True)] == [0]


def test_thousands_of_ranks_score_in_time(tmp_path: Path) -> None:
    """4096 ranks x 12 steps: the peers' medians from one sort a step (the property above
    holds them equal to the plain ones); the slow rank alone is named."""
    rng = random.Random(1)
    times = {str(r): [0.1 * rng.uniform(0.95, 1.05) * (1.5 if r == 77 else 1.0)
                      for _ in range(12)] for r in range(4096)}  # fmt: skip
    assert list(named(times, 1.3)) == ["77"]
