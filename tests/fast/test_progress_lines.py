"""The no-progress rule (runtime/watch/marks.progressed, runtime/job/life.py) against
checkpoint lines: a line that names no step ("checkpoint saved", a spec's "Saving
checkpoint") proves no progress by itself, so a crash loop that prints one every attempt
is still stopped by max_attempts_without_progress; the real trainers' lines, which carry
their step, keep deciding it as before."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TrebFn, status_json, write_spec
from trebuchet.runtime.watch.marks import DEFAULT_CHECKPOINT_PATTERN, LineCheckpoints, progressed

# What the trainers print once they saved (their source: transformers' Trainer._save_checkpoint,
# Lightning's ModelCheckpoint(verbose=True), Megatron-LM's save_checkpoint, DeepSpeed's engine)
HF = b"Saving model checkpoint to /ckpt/checkpoint-%d"
LIGHTNING = (b"Epoch 0, global step %d: 'val_loss' reached 0.81250 (best 0.81250), saving "
             b"model to '/ckpt/epoch=0-step=%d.ckpt' as top 1")  # fmt: skip
MEGATRON = b"  successfully saved checkpoint from iteration %7d to /ckpt [ t 1/1, p 1/1 ]"
DEEPSPEED = b"[Torch] Checkpoint global_step%d is ready now!"


def say(run: Path, attempt: int, line: bytes, pattern: str = DEFAULT_CHECKPOINT_PATTERN) -> None:
    """A rank's log line, read by the agent's hook as it reads it (marks/rank-0.from-log)."""
    adir = run / f"attempt-{attempt}"
    adir.mkdir(parents=True, exist_ok=True)
    LineCheckpoints(str(adir), pattern)("rank-0", line)


def steps(run: Path, attempt: int, *numbers: int, kind: str = "step") -> None:
    """The rank's own step marks (trebuchet.dist.mark("step", n)), a little before now."""
    folder = run / f"attempt-{attempt}" / "marks"
    folder.mkdir(parents=True, exist_ok=True)
    t = time.time() - 5
    (folder / "rank-0").write_text("".join(f"{t + i * 0.1:.6f} {kind} {n}\n"
                                           for i, n in enumerate(numbers)))  # fmt: skip


def test_a_checkpoint_line_without_a_step_is_no_progress_by_itself(tmp_path: Path) -> None:
    for pattern, line in ((DEFAULT_CHECKPOINT_PATTERN, b"rank 0: checkpoint saved"),
                          ("Saving checkpoint", b"Saving checkpoint ...")):  # fmt: skip
        run = tmp_path / pattern[:4]
        for attempt in range(3):
            say(run, attempt, line, pattern)
            assert progressed(str(run), attempt, time.time() - 60) is False, (pattern, attempt)


def test_the_trainers_lines_carry_their_step_and_decide_progress(tmp_path: Path) -> None:
    run = tmp_path / "run"
    said = [(HF % 500, True), (HF % 500, False), (MEGATRON % 600, True),
            (LIGHTNING % (600, 600), False), (LIGHTNING % (700, 700), True),
            (DEEPSPEED % 800, True), (DEEPSPEED % 800, False)]  # fmt: skip
    for attempt, (line, kept) in enumerate(said):
        say(run, attempt, line)
        assert progressed(str(run), attempt, time.time() - 60) is kept, (attempt, line)


def test_a_line_without_a_step_takes_the_step_the_rank_had_reached(tmp_path: Path) -> None:
    """Its step is the last one marked before it (the rank's marks, or the metrics'): a
    resumed attempt that saves past the last checkpoint made progress, a loop that saves
    the same step again did not."""
    run = tmp_path / "run"
    steps(run, 0, 1, 2, 3)
    say(run, 0, b"checkpoint saved")
    assert progressed(str(run), 0, time.time() - 60) is True
    steps(run, 1, 3)
    say(run, 1, b"checkpoint saved")
    assert progressed(str(run), 1, time.time() - 60) is False  # step 3 again
    steps(run, 2, 3, 4, 5)
    say(run, 2, b"checkpoint saved")
    assert progressed(str(run), 2, time.time() - 60) is True


CRASH_LOOP = "import sys; print('checkpoint saved', flush=True); sys.exit(3)"


def test_a_crash_loop_that_says_checkpoint_saved_is_stopped_by_the_rule(
    treb: TrebFn, tmp_path: Path
) -> None:
    """retries: 5, each attempt prints a numberless checkpoint line and fails: the run ends
    after max_attempts_without_progress (3) attempts, not after all 6."""
    spec = write_spec(tmp_path, f"command: [{sys.executable}, -c, {CRASH_LOOP!r}]\n"
                                "retries: 5\n")  # fmt: skip
    res = treb("run", str(spec), timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr
    st = status_json(treb)
    assert st["state"] == "FAILED"
    assert len(st["attempts"]) == 3, st["attempts"]
    assert st["attempts"][-1]["reason"] == "no_progress: no_retry", st["attempts"]
    assert "3 attempts in a row kept no work" in res.stdout + res.stderr


def trains(run: Path, attempt: int, *lines: bytes) -> None:
    """A rank's log lines as the agent reads them: its metrics (metric_reader's hook) and
    its checkpoint lines (the default pattern), in order; a `None` line waits past
    SAME_MARK_S, so that the next checkpoint line is another save."""
    from trebuchet.runtime.watch import metric_reader
    from trebuchet.runtime.watch.marks import SAME_MARK_S

    adir = run / f"attempt-{attempt}"
    adir.mkdir(parents=True, exist_ok=True)
    metrics = metric_reader.Metrics(str(adir), metric_reader.Config())
    saves = LineCheckpoints(str(adir), DEFAULT_CHECKPOINT_PATTERN)
    for line in lines:
        if not line:
            time.sleep(SAME_MARK_S + 0.05)
            continue
        metrics("rank-0", line)
        saves("rank-0", line)
        time.sleep(0.002)  # a metrics point's time is kept to the millisecond
    metrics.close()


def test_metrics_without_a_step_lend_no_step_to_a_checkpoint_line(tmp_path: Path) -> None:
    """A log's metrics that name no step (`{"loss": 0.5}`) are numbered by how many points each
    attempt printed, from 1 again in every attempt: no step that a numberless checkpoint
    line can hold. Held, a resumed attempt shorter than the first never progressed (a
    healthy run stopped as a crash loop), and a crash loop that printed more lines than
    before did."""
    run = tmp_path / "run"
    loss = b'{"loss": 0.5}'
    trains(run, 0, *[loss] * 10, b"checkpoint saved")
    # resumed, saved, trained and saved again: kept work, however few lines it printed
    trains(run, 1, *[loss] * 3, b"checkpoint saved", b"", *[loss] * 3, b"checkpoint saved")
    assert progressed(str(run), 1, time.time() - 60) is True
    # a crash loop's attempt: more lines than any before, the one save: nothing proven
    trains(run, 2, *[loss] * 30, b"checkpoint saved")
    assert progressed(str(run), 2, time.time() - 60) is False


def test_an_attempt_that_trained_between_two_saves_kept_work(tmp_path: Path) -> None:
    """No step anywhere (a trainer's `checkpoint saved`, metrics lines that name none): an
    attempt whose rank saved, trained (printed metrics) and saved again kept work; one save
    an attempt (the crash loop that saves as it starts, or as it dies), or one save's two
    lines, proves none."""
    run = tmp_path / "run"
    loss = b'{"loss": 0.5}'
    for attempt in (0, 1):
        trains(run, attempt, b"checkpoint saved", b"", loss, b"checkpoint saved")
        assert progressed(str(run), attempt, time.time() - 60) is True
    trains(run, 2, loss, b"checkpoint saved", b"checkpoint saved", loss)  # said twice at once
    assert progressed(str(run), 2, time.time() - 60) is False
    trains(run, 3, loss, b"Saving model to /ckpt", b"", b"checkpoint saved", loss)  # one save
    assert progressed(str(run), 3, time.time() - 60) is False


HEALTHY = ("import json, sys, time; p = lambda s: print(s, flush=True); p('checkpoint saved'); "
           "time.sleep(2.5); p(json.dumps({'loss': 0.5})); p('checkpoint saved'); sys.exit(3)")  # fmt: skip


def test_a_run_that_trains_between_numberless_saves_is_not_stopped(
    treb: TrebFn, tmp_path: Path
) -> None:
    """The healthy twin of the crash loop above: each attempt saves, trains (a metrics
    line without a step) and saves again before a failure; all retries: 2 are run, none
    stopped as no progress (the saves 2.5 s apart: the agent reads a log in bursts, and one
    checkpoint said twice within SAME_MARK_S of its reading is one)."""
    spec = write_spec(tmp_path, f"command: [{sys.executable}, -c, {HEALTHY!r}]\nretries: 2\n"
                      "max_attempts_without_progress: 2\n")  # fmt: skip
    res = treb("run", str(spec), timeout=240)
    assert res.returncode == 1, res.stdout + res.stderr
    st = status_json(treb)
    assert len(st["attempts"]) == 3, st["attempts"]
    assert all("no_progress" not in str(a.get("reason")) for a in st["attempts"]), st["attempts"]


def test_a_checkpoint_lines_step_is_its_last_number_not_its_folders(tmp_path: Path) -> None:
    """HF's line names the checkpoint's path, whose folders may look like a step of their
    own (an output_dir `/exp/step_2/`, `/exp/from-checkpoint-7/`): the step is the last
    one the line gives (checkpoint-500), or every save held 2 and a healthy run was
    stopped as a crash loop."""
    for folder in ("/exp/step_2", "/exp/from-checkpoint-7", "/exp/global_step3"):
        run = tmp_path / folder.rsplit("/", 1)[1]
        for attempt, step in enumerate((500, 600, 700)):
            say(run, attempt, f"Saving model checkpoint to {folder}/checkpoint-{step}".encode())
            assert progressed(str(run), attempt, time.time() - 60) is True, (folder, step)
    run = tmp_path / "megatron"
    for attempt, step in enumerate((500, 600)):
        say(run, attempt, MEGATRON % step)
        assert progressed(str(run), attempt, time.time() - 60) is True


def test_a_dropped_value_at_the_end_lends_no_step(tmp_path: Path) -> None:
    """A metrics line whose only value is not finite (`{"loss": NaN}`) is counted at the
    file's close, in a point of step 0 when no line named a step: no step either."""
    run = tmp_path / "run"
    loss = b'{"loss": 0.5}'
    trains(run, 0, b"checkpoint saved", b"", loss, b"checkpoint saved", b'{"loss": NaN}')
    assert progressed(str(run), 0, time.time() - 60) is True


_WORDS = st.sampled_from([b"checkpoint", b"step", b"compute", b"nan", b"1e999", b"-1", b"inf",
                          b"9" * 400, b"1e308", b"\0", b"\xed\xa0\x80", b"\n", b" ", b"1.5"])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_WORDS, max_size=5).map(b" ".join), max_size=8),
       st.lists(st.binary(max_size=60) | st.sampled_from(
           [b'{"t": 1, "s": 1e999, "m": {}}', b'{"t": NaN, "s": 1}', b'{"t": 5, "s": 3, "c": 1}',
            b'{"t": 1e999, "s": 1}', b'{"t": 2, "s": ' + b"9" * 400 + b"}"]), max_size=6))  # fmt: skip
def test_any_marks_and_points_give_a_verdict(marks: list[bytes], points: list[bytes]) -> None:
    """Whatever a rank wrote in its marks and metrics files: progressed answers True, False
    or None, never an exception, and every step it holds is finite."""
    import tempfile

    from trebuchet.runtime.watch.marks import attempt_marks, checkpoint_steps

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        for attempt in (0, 1):
            adir = run / f"attempt-{attempt}"
            (adir / "marks").mkdir(parents=True)
            (adir / "metrics").mkdir()
            (adir / "marks" / "rank-0").write_bytes(b"\n".join(marks))
            (adir / "marks" / "rank-1.from-log").write_bytes(b"\n".join(marks[::-1]))
            (adir / "metrics" / "rank-0.jsonl").write_bytes(b"\n".join(points))
            assert progressed(str(run), attempt, 0.0) in (True, False, None)
            held = checkpoint_steps(attempt_marks(str(adir)))
            assert all(math.isfinite(n) for n in held), held


def test_a_rank_that_marks_only_compute_has_its_steps(tmp_path: Path) -> None:
    """docs/goodput.md's straggler loop marks `compute` with the step (`step` optional):
    a numberless checkpoint line holds that step, as it holds a `step` mark's."""
    run = tmp_path / "run"
    for attempt, numbers, kept in ((0, (1, 2, 3), True), (1, (3,), False), (2, (3, 4, 5), True)):
        steps(run, attempt, *numbers, kind="compute")
        say(run, attempt, b"checkpoint saved")
        assert progressed(str(run), attempt, time.time() - 60) is kept, attempt
