"""Issue 38 on what real trainers printed (tests/fixtures/trainers, README there says which
release printed which file): the metrics reader, the results reader and the progress reader
take each form, through the agent's own line splitter."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.results import parse as results
from trebuchet.runtime.watch import eta
from trebuchet.runtime.watch import metric_reader as rm
from trebuchet.runtime.watch.display_lines import Splitter

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "trainers"


def lines(name: str) -> list[bytes]:
    """The log's lines as the agent's reader hands them over (each `\\r` redraw a line)."""
    splitter = Splitter(cap=16 << 10)
    return splitter.feed((FIXTURES / name).read_bytes() + b"\n")


def points(name: str) -> list[tuple[float | None, rm.Values]]:
    return [got for line in lines(name) if (got := rm.parse(line, rm.Config()))[1]]


def series(name: str, key: str) -> list[tuple[float | None, float]]:
    return [(step, v[key]) for step, v in points(name) if key in v]


def test_transformers_5_values_as_strings_are_metrics_with_the_epoch_as_step() -> None:
    got = series("transformers-5.25.0-tqdm.log", "loss")
    assert got[:2] == [(0.009766, 4.559), (0.01953, 4.551)] and len(got) == 8
    end = points("transformers-5.25.0-tqdm.log")[-1][1]
    assert end["train_samples_per_second"] == 334.9 and end["train_runtime"] == 0.9556
    assert series("transformers-5.25.0-no-tqdm.log", "learning_rate")[0] == (0.009766, 0.0004667)


def test_transformers_4_floats_still_read() -> None:
    got = series("transformers-4.57.6-tqdm.log", "loss")
    assert got[0] == (0.01, 4.5587) and len(got) == 8
    assert series("transformers-4.57.6-no-tqdm.log", "grad_norm")[0] == (0.009765625,
                                                                        1.005873680114746)  # fmt: skip


def test_lightning_bar_metrics_with_the_global_batch_as_step() -> None:
    got = dict(series("lightning-2.6.6-tqdm.log", "train_loss"))
    assert got[24.0] == 0.916 and got[2.0] == 0.663  # Epoch 2, 8/8; Epoch 0, 2/8
    assert series("lightning-2.6.6-tqdm.log", "val_loss")[-1] == (24.0, 0.851)
    names = {k for _, v in points("lightning-2.6.6-tqdm.log") for k in v}
    assert names == {"train_loss", "val_loss"}  # not v_num, a warning's path or max_epochs
    assert series("lightning-2.6.6-rich.log", "train_loss") == [(24.0, 0.916)]


def test_accelerate_printed_dicts_and_epoch_lines() -> None:
    assert series("accelerate-1.16.0.log", "train_loss")[0] == (5.0, 1.430983304977417)
    assert series("accelerate-1.16.0.log", "loss") == [(0.0, 0.8785), (1.0, 0.851), (2.0, 1.0465)]


@pytest.mark.parametrize(("name", "value"), [("transformers-5.25.0-tqdm.log", 334.9),
                                             ("transformers-4.57.6-tqdm.log", 362.336)])  # fmt: skip
def test_results_read_the_trainers_samples_per_second(name: str, value: float) -> None:
    got = results.hf_samples_per_second(FIXTURES / name)
    assert got is not None and got.value == value and got.metric == "samples_per_second"


def readings(name: str) -> list[dict]:
    parser = eta.Parser()
    return [r for line in lines(name) if (r := parser.parse(line)[0]) is not None]


@pytest.mark.parametrize("name", ["transformers-5.25.0-tqdm.log", "transformers-5.25.0-no-tqdm.log",
                                  "transformers-4.57.6-tqdm.log",
                                  "transformers-4.57.6-no-tqdm.log",
                                  "transformers-5.25.0-no-tqdm-resumed.log"])  # fmt: skip
def test_progress_is_the_trainers_steps_never_a_checkpoint_bar(name: str) -> None:
    got = readings(name)
    total = 40 if "tqdm.log" in name and "no-tqdm" not in name else 60
    assert got and all(r["total"] == total for r in got), got
    steps = [r["step"] for r in got]
    assert steps == sorted(steps) and steps[-1] in (30, 40, 60)


def test_no_tqdm_steps_from_the_epoch() -> None:
    steps = [r["step"] for r in readings("transformers-5.25.0-no-tqdm.log")]
    assert steps == [5, 10, 15, 20, 25, 30]  # 'epoch': '0.009766' x 512 steps an epoch
    steps = [r["step"] for r in readings("transformers-4.57.6-no-tqdm.log")]
    assert steps == [5, 10, 15, 20, 25, 30]  # 4,096 examples / a batch of 8


def test_lightning_progress_is_the_epoch_bar_not_validation() -> None:
    got = readings("lightning-2.6.6-tqdm.log")
    assert got and {r["total"] for r in got} == {8}


def test_a_resumed_bar_rate_is_measured_from_the_resume(tmp_path: Path) -> None:
    """The real resumed bar: 0/60, then 31/60 at tqdm's 128.82 it/s; the rate recorded is the
    steps over the time after the first advance, not tqdm's."""
    adir = tmp_path / "attempt-1"
    adir.mkdir()
    e = eta.Eta(str(adir))
    bars = [line for line in lines("transformers-5.25.0-tqdm-resumed.log") if b"/60 [" in line]
    assert b"128.82it/s" in bars[1]
    for line in bars[:2]:
        e("rank-0", line)
        e.flush()
    e.samples = [(t - 4.0, s) for t, s in e.samples]  # 31/60 read 4 s ago
    e("rank-0", next(b for b in bars if b"35/60" in b))
    e.flush()
    got = eta.read(str(tmp_path), 1)
    assert got["step"] == 35 and 0.5 < got["rate"] < 2  # 4 steps in 4 s, not 128.82
    assert 10 < got["eta_s"] < 50


def test_a_stalled_run_says_so_instead_of_counting_down(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    e = eta.Eta(str(adir))
    for n in (10, 20, 30):
        e("rank-0", b"step %d/60" % n)
        e.flush()
    record = json.loads((tmp_path / eta.FILE).read_text())
    assert eta.read(str(tmp_path))["stalled_s"] is None
    now = time.time()
    for ago, gap, stalled in ((100, 1.0, True), (100, 20.0, False), (10, 0.1, False)):
        record.update(moved=now - ago, gap_s=gap, t=now - ago, eta_s=30.0)
        (tmp_path / eta.FILE).write_text(json.dumps(record))
        got = eta.read(str(tmp_path))
        if stalled:
            assert got["eta_s"] is None and got["stalled_s"] >= ago
        else:
            assert got["stalled_s"] is None and got["eta_s"] is not None


FIXTURE_LINES = [line for name in sorted(os.listdir(FIXTURES)) if name.endswith(".log")
                 for line in lines(name)]  # fmt: skip
MUTATE = (
    st.sampled_from(FIXTURE_LINES)
    .flatmap(
        lambda line: st.tuples(st.just(line), st.integers(0, len(line)), st.binary(max_size=12))
    )
    .map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :])
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(MUTATE, st.sampled_from(FIXTURE_LINES)), max_size=12))
def test_real_lines_mutated_never_raise_and_stay_finite(got: list[bytes]) -> None:
    """Real trainer lines with bytes spliced in: every reader stays total, values finite."""
    parser = eta.Parser()
    for line in got:
        step, values, dropped = rm.read(line, rm.Config(prefix="x"))
        assert step is None or math.isfinite(step)
        assert dropped >= 0 and all(math.isfinite(v) for v in values.values())
        reading, left = parser.parse(line)
        if reading is not None:
            assert all(v is None or (math.isfinite(v) and v >= 0) for v in reading.values())
        assert left is None or math.isfinite(left)


KEYS = st.sampled_from(["loss", "grad_norm", "learning_rate", "train_runtime", "x.y/z"])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, st.floats(allow_nan=True, allow_infinity=True), min_size=1),
       st.floats(0, 1e6), st.booleans())  # fmt: skip
def test_any_trainer_dict_in_either_release_form(d: dict, epoch: float, five: bool) -> None:
    """The Trainer's dict as 4 (floats) or 5 (`f"{v:.4g}"` strings) prints it: each finite
    value is read as printed, the others dropped and counted, the epoch is the step."""
    shown_d = {**d, "epoch": epoch}
    if five:
        shown_d = {k: f"{v:.4g}" for k, v in shown_d.items()}
    step, values, dropped = rm.read(repr(shown_d).encode())
    want = {k: float(v) for k, v in shown_d.items() if math.isfinite(float(v))}
    assert values == want and dropped == len(shown_d) - len(want)
    assert step == float(shown_d["epoch"])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 10**6), st.integers(0, 10**6),
       st.lists(st.tuples(KEYS, st.floats(allow_nan=False, allow_infinity=False)), max_size=4),
       st.text(max_size=30))  # fmt: skip
def test_any_lightning_bar(epoch: int, total: int, n: int, post: list, after: str) -> None:
    """A TQDMProgressBar line with any postfix, and any text printed after it: its items
    are the metrics at epoch x total + n, the text after the bracket never one."""
    items = "".join(f", {k}={v:.3g}" for k, v in post)
    line = f"Epoch {epoch}:  50%|#    | {n}/{total} [00:01<00:01, 3.2it/s{items}]{after}"
    step, values = rm.parse(line.encode("utf-8", "surrogatepass"))
    last = {k: float(f"{v:.3g}") for k, v in post}  # a name twice: its last value
    want = {k: v for k, v in last.items() if math.isfinite(v)}
    if want and not after.strip():
        assert values == want and step == epoch * total + n
    assert set(values) <= set(want) and all(math.isfinite(v) for v in values.values())


def test_a_silent_log_tail_is_stalled_too(tmp_path: Path) -> None:
    """Engines whose agents keep their records on the nodes read the log's tail: a log
    that stopped growing long ago is a stalled run, not an ETA of 0 s."""
    log = tmp_path / "rank-0.log"
    log.write_bytes(b" 50%|#####     | 30/60 [00:10<00:10, 3.0it/s]")
    assert eta.from_log_tail(str(log))["stalled_s"] is None
    old = time.time() - 120
    os.utime(log, (old, old))
    got = eta.from_log_tail(str(log))
    assert got["stalled_s"] >= 120 and got["eta_s"] is None and got["step"] == 30
