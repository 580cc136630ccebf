"""Issue 38's readers against a hostile rank (adversary): quoted values that are no number,
lines that cost the square of their length to a careless regex, a printed `Total
optimization steps` that would silence the training loop's bar, bars whose total changes
on every line, epochs that go backwards, and clocks that do not move. Every reader stays
total, linear and finite. (No timing assertion: the lines below made the old regexes take
minutes, so the old code did not finish these tests.)"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.cli.top_cmd import progress_cell
from trebuchet.results import parse as results
from trebuchet.runtime.watch import eta
from trebuchet.runtime.watch import metric_reader as rm
from trebuchet.runtime.watch.display_lines import shown

BAR = b" 45%|####      | 450/1000 [00:10<00:12, 43.2it/s]"


def test_a_storm_of_digit_runs_before_a_rate_is_read_in_linear_work() -> None:
    """`111...1 /s` at the bar scan's length, redrawn 300 times (a \\r storm): the rate's
    regex tried every digit as its start, each scanning to the run's end (0.27 s a line)."""
    storm = b"1" * (rm.SCAN_BAR - 8) + b" /s"
    for _ in range(300):
        assert rm.read(storm) == (None, {}, 0)
    assert rm.read(b"Epoch 0:  50%|#| 4/8 [00:01<00:01, 3.2it/s, loss=0.5]") == (
        4.0,
        {"loss": 0.5},
        0,
    )


def test_a_long_word_after_the_prefix_is_read_in_linear_work() -> None:
    """A spec's `prefix`, then one word as long as a line the reader hands over: the pair
    regex's key ran to the word's end from each of its letters (10 s a line)."""
    config = rm.Config(prefix="metrics:")
    word = b"metrics: " + b"a" * (16 << 10)
    for _ in range(4):
        assert rm.read(word, config) == (None, {}, 0)
    assert rm.read(b"metrics: step=3 loss=0.5", config) == (3.0, {"loss": 0.5}, 0)


def test_a_bar_named_by_a_run_of_spaces_is_read_in_linear_work(tmp_path: Path) -> None:
    """A validation bar padded with 1,900 spaces, redrawn 300 times, never the main one:
    the percentage's regex began at each space (0.1 s a line, every line of a step)."""
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    e = eta.Eta(str(adir))
    e("rank-0", BAR)
    e.flush()
    for _ in range(300):
        e("rank-0", b"Validation" + b" " * 1900 + b"| 1/2000 [00:01<00:01]")
        e("rank-0", b"Total train batch size" + b" " * 2000 + b" = ")  # read at once
    e.flush()
    assert eta.read(str(tmp_path))["step"] == 450


def test_a_printed_total_never_silences_the_training_bar() -> None:
    """The Trainer's `Total optimization steps` as a rank could print it (a fake, 0, -5,
    1e999, 2,000 digits): the bar that runs is still read, and no dict reads 1/1."""
    for total in (b"5", b"0", b"-5", b"1e999", b"9" * 2000, b",", b"1.5"):
        p = eta.Parser()
        p.parse(b"  Total optimization steps = " + total)
        reading, _ = p.parse(BAR)
        assert reading is not None and (reading["step"], reading["total"]) == (450, 1000), total
        p.parse(b"  Num update steps per epoch = 100")
        reading, _ = p.parse(b"{'loss': '1', 'epoch': '0.5'}")
        assert reading is None or reading["total"] not in (1.0, math.inf), (total, reading)


def test_the_trainers_total_still_rules_out_an_evaluation_bar() -> None:
    p = eta.Parser()
    p.parse(b"  Total optimization steps = 60")
    assert p.parse(b" 50%|#####     | 30/60 [00:10<00:10, 3.0it/s]")[0]["step"] == 30
    assert p.parse(b" 90%|######### | 900/1000 [00:01<00:00, 900it/s]")[0] is None


LINE = st.one_of(
    st.builds(
        lambda n, t, name: b"%s %d%%|#| %d/%d [00:01<00:02, 3.0it/s]" % (name, 50, n, t),
        st.integers(0, 10**18),
        st.integers(0, 10**18),
        st.sampled_from([b"", b"Training", b"Validation", b"Epoch 3:"]),
    ),  # fmt: skip
    st.builds(
        lambda v: b"  Total optimization steps = " + v,
        st.sampled_from([b"0", b"-5", b"1e999", b"9" * 400, b"60", b"1,000", b"x"]),
    ),
    st.builds(
        lambda v: b"  Num update steps per epoch = " + v,
        st.sampled_from([b"0", b"1e999", b"9" * 400, b"10"]),
    ),
    st.builds(
        lambda e: b"{'loss': '1.0', 'epoch': '%s'}" % e,
        st.sampled_from([b"-1", b"nan", b"inf", b"1e999", b"9" * 5000, b"0.5", b"3"]),
    ),
    st.builds(lambda s, t: b"step %d/%d" % (s, t), st.integers(0, 10**20), st.integers(0, 10**20)),
    st.binary(max_size=40),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(LINE, max_size=6), max_size=8), st.booleans())
def test_any_steps_of_hostile_progress_lines_keep_the_record_finite(
    tmp_path_factory, steps: list[list[bytes]], same_clock: bool
) -> None:
    """Any reader steps of such lines, with or without a clock that moves between readings:
    no exception, and the record's figures are finite, non-negative, a fraction at most 1."""
    run = tmp_path_factory.mktemp("run")
    adir = run / "attempt-2"
    adir.mkdir()
    e = eta.Eta(str(adir))
    for lines in steps:
        for line in lines:
            e("rank-0", line)
        if same_clock and e.samples:  # every reading at the same instant
            e.samples = [(e.samples[0][0], s) for _, s in e.samples]
        e.flush()
        got = eta.read(str(run), 2)
        if got is None:
            continue
        raw = json.loads((run / eta.FILE).read_text())
        for k in ("step", "total", "fraction", "rate", "eta_s", "gap_s", "stalled_s"):
            v = got.get(k)
            assert v is None or (math.isfinite(v) and v >= 0), (k, raw)
        assert got["fraction"] is None or got["fraction"] <= 1


HOSTILE = st.one_of(
    st.sampled_from(
        [
            "1e999",
            "9" * 5000,
            "-0",
            "0x10",
            "1_000",
            " 1 ",
            "NaN",
            "inf",
            "-inf",
            "1e308",
            "",
            "\x1b[31m1",
            "1\ud800",
        ]
    ),  # fmt: skip
    st.floats().map(lambda v: f"{v:.4g}"),
    st.text(max_size=20),
)
NAME = st.one_of(st.sampled_from(["loss", "epoch", "step", "\x1b]0;x\x07", "\ud800", "a\u202eb"]),
                 st.text(max_size=12))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(NAME, HOSTILE, min_size=1, max_size=6), st.booleans(), st.text(max_size=20))
def test_any_quoted_values_and_keys_in_either_form_stay_finite_and_inert(
    d: dict, as_json: bool, before: str
) -> None:
    """A Trainer 5-like dict (or a JSON line) of any names and any quoted values, after any
    prefix: a number is read only where the string is one, the step and values are finite,
    and every name is inert (shown as a terminal shows it)."""
    text = before + (json.dumps(d) if as_json else repr(d))
    step, values, dropped = rm.read(text.encode("utf-8", "surrogatepass"))
    assert step is None or math.isfinite(step)
    assert dropped >= 0 and all(math.isfinite(v) for v in values.values())
    assert all(shown(k) == k for k in values)


def test_deep_and_long_dicts_are_no_values() -> None:
    deep = b"{'a': " * 10_000 + b"'1'" + b"}" * 10_000
    long = b"{" + b", ".join(b"'k%d': '%d'" % (i, i) for i in range(100_000)) + b"}"
    for line in (deep, long, b"{'epoch': '" + b"9" * 5000 + b"', 'loss': '1'}"):
        step, values, _ = rm.read(line)
        assert step is None or math.isfinite(step)
        assert all(math.isfinite(v) for v in values.values())


@settings(max_examples=200, deadline=None)
@given(HOSTILE, st.sampled_from(["'", '"', ""]), st.binary(max_size=30))
def test_results_read_any_quoted_samples_per_second(tmp_path_factory, v: str, q: str,
                                                    noise: bytes) -> None:  # fmt: skip
    """`'train_samples_per_second': '<anything>'`: the number when the quoted text is one and
    finite, else no value; never an exception."""
    log = tmp_path_factory.mktemp("r") / "rank-0.log"
    line = f"{{'train_runtime': '25.42', 'train_samples_per_second': {q}{v}{q}}}"
    log.write_bytes(noise + b"\n" + line.encode("utf-8", "surrogatepass") + b"\n")
    got = results.hf_samples_per_second(log)
    assert got is None or (math.isfinite(got.value) and got.metric == "samples_per_second")
    try:
        want = float(v) if re.fullmatch(rm.NUMBER.decode(), v) else None
    except ValueError:
        want = None
    if want is not None and math.isfinite(want) and b"samples_per_second" not in noise:
        assert got is not None and got.value == want


def test_counts_past_what_a_float_counts_are_no_progress(tmp_path: Path) -> None:
    """A bar's total, or its time left, of 290 digits (finite, so it passed), or a record a
    rank wrote with such figures: no reading, so `treb ps` / `top` cells stay short."""
    p = eta.Parser()
    assert p.parse(b" 50%|#| 5/" + b"9" * 290 + b" [00:01<00:01, 3.0it/s]")[0] is None
    assert p.parse(b" 50%|#| 5/10 [00:01<" + b"9" * 290 + b", 3.0it/s]")[1] is None
    now = time.time()
    record = {"attempt": 0, "step": 1e299, "total": 1e299, "fraction": 1, "rate": 1e-299,
              "eta_s": 9e299, "t": now, "moved": now, "gap_s": 1.0}  # fmt: skip
    (tmp_path / eta.FILE).write_text(json.dumps(record))
    got = eta.read(str(tmp_path))
    assert len(progress_cell(got)) < 40, progress_cell(got)


FIGURE = st.one_of(st.none(), st.booleans(), st.integers(-(10**400), 10**400),
                   st.floats(), st.text(max_size=5), st.lists(st.integers(), max_size=2))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["attempt", "step", "total", "fraction", "rate",
                                        "eta_s", "t", "moved", "gap_s", "stalled_s"]),
                       FIGURE), st.binary(max_size=300))  # fmt: skip
def test_any_progress_record_or_log_tail_reads_finite(tmp_path_factory, record: dict,
                                                      log: bytes) -> None:  # fmt: skip
    """progress.json as a rank could write it, and any log tail: read without exception,
    figures finite and non-negative, the views' cells plain text."""
    run = tmp_path_factory.mktemp("run")
    text = json.dumps(record, default=str).replace("Infinity", "1e999")
    (run / eta.FILE).write_text(text)
    (run / "rank-0.log").write_bytes(log)
    for got in (eta.read(str(run)), eta.from_log_tail(str(run / "rank-0.log"))):
        if got is None:
            continue
        for k in ("step", "total", "fraction", "rate", "eta_s", "stalled_s"):
            v = got.get(k)
            assert v is None or (math.isfinite(v) and 0 <= v < 2**53), (k, v)
        assert progress_cell(got).isprintable()
