"""The goodput accounting (trebuchet/goodput/) on recorded timelines, and the no-progress
rule (runtime/job/life.next_step, runtime/watch/marks.progressed) that stops a run whose
attempts keep no work. Real files in a temporary run folder; no process is started."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.goodput.account import LOST_CAUSES, Attempt, Timeline, account, line
from trebuchet.goodput.timeline import from_events, load
from trebuchet.runtime.job import life as lifecycle
from trebuchet.runtime.job.life import END, NO_PROGRESS, RETRY, next_step
from trebuchet.runtime.watch.marks import attempt_marks, parse_marks, parse_points, progressed

RETRY_ALL = {"name": "any", "pattern": "boom", "action": "retry", "max_retries": 50}


def events(*rows: tuple[float, str, dict]) -> list[dict]:
    return [{"time": t, "event": kind, **fields} for t, kind, fields in rows]


def write_events(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def marks_file(adir: Path, rank: str, lines: list[str]) -> None:
    (adir / "marks").mkdir(parents=True, exist_ok=True)
    (adir / "marks" / rank).write_text("".join(f"{x}\n" for x in lines))


def test_a_killed_attempt_splits_into_kept_redone_restart(tmp_path: Path) -> None:
    """Submitted at 0, environment 2 s, attempt 0 from 5: steps 10..45, a checkpoint at 30,
    a rank dies at 46, the attempt ends at 48; attempt 1 from 50: steps 55..100, the run
    ends at 101. Every second is placed, and where it is known."""
    run = tmp_path / "run"
    write_events(run, events(
        (0, "submitted", {}), (4, "environment_ready", {"seconds": 2.0}),
        (5, "attempt_started", {"attempt": 0}), (48, "attempt_ended", {"attempt": 0,
                                                                       "state": "FAILED"}),
        (50, "attempt_started", {"attempt": 1}),
        (100.5, "attempt_ended", {"attempt": 1, "state": "SUCCEEDED"}),
        (101, "run_ended", {"state": "SUCCEEDED"}),
    ))  # fmt: skip
    a0, a1 = run / "attempt-0", run / "attempt-1"
    marks_file(a0, "rank-0", [f"{t} step {t - 9}" for t in range(10, 46)] + ["30.0 checkpoint 21"])
    marks_file(a1, "rank-0", [f"{t} step {t}" for t in range(55, 101)])
    (a0 / "first-failure").write_text(json.dumps({"ended_at": 46.0, "node": 1, "rank": 3}))
    g = account(load(run, "r1", json.loads("[" + ",".join(
        (run / "events.jsonl").read_text().splitlines()) + "]")), now=1e9)  # fmt: skip
    assert g.wall_s == 101
    assert g.seconds == {
        "productive": 20 + 45, "queued": 3, "environment": 2, "startup": 5, "redone": 16,
        "restart": 2 + 2 + 5, "hang": 0, "node_loss": 0, "teardown": 1, "other": 0,
    }  # fmt: skip
    assert g.by_node == {"node-1": 16}
    assert g.ettr == pytest.approx(65 / 101)
    assert line(g) == "goodput 64 %: 16s redone, 9s restarts, 5s startup"


def test_a_hang_counts_from_the_last_step_to_its_action_and_a_lost_node_to_its_loss() -> None:
    tl = from_events("r", events(
        (0, "submitted", {}), (1, "attempt_started", {"attempt": 0}),
        (40, "hang", {"attempt": 0, "action": "retry", "last_progress": 21.0}),
        (45, "attempt_ended", {"attempt": 0, "state": "FAILED"}),
        (46, "attempt_started", {"attempt": 1}),
        (70, "node_lost", {"attempt": 1, "host": "n7", "last_seen": 60.0}),
        (72, "attempt_ended", {"attempt": 1, "state": "FAILED"}),
        (72.5, "run_ended", {"state": "FAILED"}),
    ))  # fmt: skip
    tl.attempts[0].steps, tl.attempts[0].checkpoints = [2.0, 20.0], [10.0]
    tl.attempts[1].steps = [50.0, 59.0]
    g = account(tl, now=1e9)
    assert g.seconds["hang"] == 40 - 21  # from the recorded last progress
    assert g.seconds["node_loss"] == 70 - 60
    assert g.seconds["redone"] == (21 - 10) + (60 - 50)
    assert g.seconds["productive"] == 10 - 2
    assert g.by_node["n7"] == 10 + 10  # its redone work and its detection
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s)


def test_a_run_still_going_is_counted_to_now_and_its_training_kept() -> None:
    tl = Timeline(run="r", submitted=0.0, ended=None,
                  attempts=[Attempt(n=0, start=1.0, end=None, steps=[3.0, 8.0])])  # fmt: skip
    g = account(tl, now=10.0)
    assert (g.wall_s, g.seconds["startup"], g.productive_s) == (10.0, 2.0, 7.0)


def test_hostile_events_give_a_timeline_never_an_exception(tmp_path: Path) -> None:
    rows = [{"time": "x", "event": "attempt_started"}, {"time": float("nan"), "event": 3},
            {"time": 1.0, "event": "attempt_started", "attempt": True},
            {"time": 2.0, "event": "hang", "attempt": 10**30, "last_progress": "\x1b]0;"},
            {"time": 3.0, "event": "attempt_started", "attempt": 0},
            {"time": 1e308, "event": "run_ended", "state": ["\ud800"]}]  # fmt: skip
    g = account(from_events("r", rows), now=5.0)
    assert all(math.isfinite(v) and v >= 0 for v in g.seconds.values())
    assert g.attempts == 1


@st.composite
def timelines(draw: st.DrawFn) -> Timeline:
    t = st.floats(0, 1e4, allow_nan=False)
    starts = sorted(draw(st.lists(t, max_size=5)))
    attempts = []
    for n, s in enumerate(starts):
        end = draw(st.one_of(st.none(), t))
        attempts.append(Attempt(
            n=n, start=s, end=end, state=draw(st.sampled_from(["FAILED", "SUCCEEDED",
                                                               "TIMEOUT", "RUNNING"])),
            steps=draw(st.lists(t, max_size=6)), checkpoints=draw(st.lists(t, max_size=3)),
            failed_at=draw(st.one_of(st.none(), t)), hang_from=draw(st.one_of(st.none(), t)),
            hang_acted=draw(st.one_of(st.none(), t)), node=draw(st.one_of(st.none(), st.text())),
        ))  # fmt: skip
    return Timeline(run="r", submitted=draw(t), ended=draw(st.one_of(st.none(), t)),
                    environment_s=draw(t), attempts=attempts)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(timelines(), st.floats(0, 2e4, allow_nan=False))
def test_any_timeline_is_a_partition_of_its_wall_time(tl: Timeline, now: float) -> None:
    g = account(tl, now)
    assert all(v >= 0 and math.isfinite(v) for v in g.seconds.values())
    assert sum(g.seconds.values()) == pytest.approx(g.wall_s, abs=1e-6)
    assert 0.0 <= g.ettr <= 1.0 + 1e-9
    assert set(g.lost) == set(LOST_CAUSES)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_marks_and_points_from_any_bytes_are_finite(data: bytes) -> None:
    for m in parse_marks(data) + parse_points(data):
        assert math.isfinite(m.t) and m.t >= 0
        assert m.n is None or math.isfinite(m.n)
        assert m.kind in ("step", "checkpoint")


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=500))
def test_marks_from_any_text_are_finite(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    for m in parse_marks(data) + parse_points(data):
        assert math.isfinite(m.t) and (m.n is None or math.isfinite(m.n))


def test_marks_lines_as_the_one_line_call_writes_them(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    marks_file(adir, "rank-0", ["12.5 step 3", "13 checkpoint 3", "1e999 step 4", "14 step nan",
                                "x step 1", "15 epoch 2", "16 STEP"])  # fmt: skip
    os.mkfifo(adir / "marks" / "rank-1")  # a FIFO is never opened for reading
    got = [(m.t, m.kind, m.n) for m in attempt_marks(str(adir))]
    assert got == [(12.5, "step", 3.0), (13.0, "checkpoint", 3.0), (16.0, "step", None)]


def test_metrics_points_stand_for_steps_when_none_is_marked(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    (adir / "metrics").mkdir(parents=True)
    (adir / "metrics" / "rank-0.jsonl").write_text(
        '{"t": 5.0, "s": 1, "m": {"loss": 2}}\n{"t": 6.0, "s": 2}\n[1]\n{"t": -1}\n'
    )
    assert [(m.t, m.n) for m in attempt_marks(str(adir))] == [(5.0, 1.0), (6.0, 2.0)]


# -- retries that know when to stop (runtime/job/life.py) --------------------------------


def test_attempts_without_progress_end_the_run_however_many_retries_remain(
    tmp_path: Path,
) -> None:
    logs = [tmp_path / "rank-0.log"]
    logs[0].write_text("boom\n")
    got = next_step("FAILED", 3, 10, [RETRY_ALL], logs, {}, no_progress=3, max_no_progress=3)
    assert (got.action, got.verdict) == (END, NO_PROGRESS)
    assert got.policy == {"name": "no_progress", "action": "no_retry"}
    assert "3 attempts in a row kept no work" in got.line
    hung = next_step("FAILED", 3, 10, [], [], {}, on_hang="retry", no_progress=3,
                     max_no_progress=3)  # fmt: skip
    assert hung.action == END
    assert next_step("FAILED", 2, 10, [], [], {}, no_progress=2, max_no_progress=3).action == RETRY
    assert next_step("FAILED", 9, 10, [], [], {}, no_progress=9, max_no_progress=0).action == RETRY
    assert next_step("SUCCEEDED", 3, 10, [], [], {}, no_progress=5, max_no_progress=3).verdict \
        != NO_PROGRESS  # fmt: skip


def test_progress_is_a_checkpoint_past_the_last_one(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert progressed(str(run), 0, 100.0) is None  # no checkpoint ever: retries alone rule
    marks_file(run / "attempt-0", "rank-0", ["10 checkpoint 20"])
    marks_file(run / "attempt-1", "rank-0", ["20 checkpoint 20", "21 step 22"])
    marks_file(run / "attempt-2", "rank-0", ["30 checkpoint 30"])
    assert progressed(str(run), 0, 5.0) is True
    assert progressed(str(run), 1, 15.0) is False  # the same step saved again
    assert progressed(str(run), 2, 25.0) is True
    run2 = tmp_path / "run2"
    (run2 / "checkpoints").mkdir(parents=True)
    (run2 / "checkpoints" / "ckpt-5").write_text("")
    os.utime(run2 / "checkpoints" / "ckpt-5", (50.0, 50.0))
    (run2 / "checkpoints" / ".ckpt-10.tmp").write_text("")  # not one yet
    assert progressed(str(run2), 1, 40.0) is True
    assert progressed(str(run2), 2, 60.0) is False


def test_the_count_survives_a_requeue_and_a_bad_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / lifecycle.NO_PROGRESS_FILE).write_text("2\n")
    assert lifecycle.no_progress_count(str(tmp_path)) == 2
    (tmp_path / lifecycle.NO_PROGRESS_FILE).write_text("-1\x1b")
    assert lifecycle.no_progress_count(str(tmp_path)) == 0


def test_an_engine_query_that_times_out_never_fails_the_job(
    treb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A squeue that hangs (a real program on PATH): the run stays RUNNING, no attempt is
    added and the no-progress count is not touched."""
    from tests.fast.test_slurm_state import add_run
    from trebuchet.backends.slurm import state as slurm_state
    from trebuchet.backends.slurm.engine import SlurmBackend
    from trebuchet.store.db import Store

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "squeue").write_text("#!/bin/sh\nexec sleep 30\n")
    (fake / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setattr(slurm_state, "SQUEUE_TIMEOUT_S", 0.5)
    store = Store()
    run_dir = add_run(store, treb_home, "stalled", "400")
    SlurmBackend().refresh(store, store.list(active_only=True))
    rec = store.get("stalled")
    assert rec is not None and rec.state == "RUNNING" and rec.first_failure is None
    assert store.attempts("stalled") == []
    assert not (run_dir / lifecycle.NO_PROGRESS_FILE).exists()


def test_the_dashboard_bar_is_the_split(tmp_path: Path) -> None:
    """The run page's bar: one segment a cause that took time, widths as their shares,
    and the summary line under it; a name with markup stays text."""
    import re

    from trebuchet.store.db import RunRecord
    from trebuchet.ui.pages import _goodput

    run = tmp_path / "run"
    write_events(run, events(
        (0, "submitted", {}), (1, "attempt_started", {"attempt": 0}),
        (9, "attempt_ended", {"attempt": 0, "state": "SUCCEEDED"}),
        (10, "run_ended", {"state": "SUCCEEDED"}),
    ))  # fmt: skip
    marks_file(run / "attempt-0", "rank-0", ["3 step 1", "9 step 2"])
    rec = RunRecord(id="r1", name="<b>x</b>", backend="local", launcher="native",
                    state="SUCCEEDED", nodes=1, procs_per_node=1, run_dir=str(run),
                    created_at=0.0, started_at=0.0, ended_at=10.0)  # fmt: skip
    html = _goodput(rec)
    widths = {c: float(w) for c, w in re.findall(r'data-cause="(\w+)"[^>]*width:([\d.]+)%', html)}
    assert widths == {"productive": 60.0, "queued": 10.0, "startup": 20.0, "teardown": 10.0}
    assert "goodput 60 %: 2s startup, 1s queued, 1s teardown" in html


def test_a_long_marks_file_keeps_its_first_step_and_no_line_cut_in_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file past what is read keeps its beginning (the attempt's first step: its startup)
    and its end (the last checkpoint and step); a line cut where the reading starts or
    stops is dropped, never read as another time (`...6533085.5 step 12`)."""
    from trebuchet.runtime.watch import marks

    monkeypatch.setattr(marks, "READ_MAX", 200)
    monkeypatch.setattr(marks, "HEAD_MAX", 100)
    adir = tmp_path / "attempt-0"
    rows = [f"{1796533000.5 + i} step {i}" for i in range(1, 200)]
    marks_file(adir, "rank-0", rows)
    got = attempt_marks(str(adir))
    assert got[0] == (1796533001.5, "step", 1.0)
    assert got[-1] == (1796533199.5, "step", 199.0)
    assert all(m.t == 1796533000.5 + m.n for m in got)  # each a whole line
    assert len(got) < 199


def test_a_checkpoint_in_the_middle_of_a_long_marks_file_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a file's ends only checkpoint lines are read (the cost stays that of its
    ends), and none of them is lost."""
    from trebuchet.runtime.watch import marks

    monkeypatch.setattr(marks, "LINES_MAX", 80)  # its first 10 lines, its last 40
    adir = tmp_path / "attempt-0"
    rows = [f"{1000.0 + i} step {i}" for i in range(1, 400)]
    rows.insert(200, "1199.5 checkpoint 199")
    marks_file(adir, "rank-0", rows)
    got = attempt_marks(str(adir))
    assert [(m.t, m.n) for m in got if m.kind == "checkpoint"] == [(1199.5, 199.0)]
    assert (got[0].n, got[-1].n) == (1.0, 399.0)
    assert len(got) < 100


def test_slurm_records_attempts_in_files_and_their_hang_still_counts(tmp_path: Path) -> None:
    """Slurm's job controller writes attempt.json, not attempt events; the hang event of
    such an attempt is its hang all the same (the Slurm test cluster counted it 0 s)."""
    run = tmp_path / "run"
    write_events(run, events(
        (0, "submitted", {}),
        (40, "hang", {"attempt": 1, "action": "retry", "last_progress": 31.0}),
        (60, "run_ended", {"state": "SUCCEEDED"}),
    ))  # fmt: skip
    for n, (start, end, state) in enumerate([(1, 20, "FAILED"), (21, 45, "FAILED"),
                                             (46, 59, "SUCCEEDED")]):  # fmt: skip
        (run / f"attempt-{n}").mkdir(parents=True)
        (run / f"attempt-{n}" / "attempt.json").write_text(json.dumps(
            {"attempt": n, "started_at": start, "ended_at": end, "state": state}))  # fmt: skip
    marks_file(run / "attempt-1", "rank-0", ["25 step 1", "30 step 2", "28 checkpoint 1"])
    rows = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    g = account(load(run, "r", rows), now=1e9)
    assert g.seconds["hang"] == 40 - 30  # from the last step before it
    assert g.seconds["redone"] >= 30 - 28
