"""Attacks on the straggler watch and the checkpoints read from log lines: a rank writing
its marks files by hand, a spec's hostile `checkpoint_pattern`, a rank printing checkpoint
lines every millisecond, host names with terminal control sequences, a threshold at its
limit (runtime/watch/straggler.py, runtime/watch/marks.py, docs/goodput.md#trust)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.cli.main import main
from trebuchet.runtime.watch import straggler
from trebuchet.runtime.watch.marks import LineCheckpoints
from trebuchet.runtime.watch.straggler import StragglerWatch

from .test_stragglers import lockstep


def test_phantom_ranks_forged_by_one_rank_name_nobody(tmp_path: Path) -> None:
    """An even 2-rank run; rank 0 writes marks files for ranks 2..63 (which do not exist)
    at half the step time: the real rank 1 must not be named for being slower than them."""
    w = StragglerWatch(str(tmp_path), 1.3, 1, world=2)
    t = lockstep(tmp_path, 2, range(20), None)
    marks = tmp_path / "marks"
    own = (marks / "rank-0").read_text().splitlines()
    fast = []
    for line in own:
        t0, kind, n = line.split()
        if kind == "compute":  # half its compute time: 0.05 s earlier
            fast.append(f"{float(t0) - 0.05:.6f} compute {n}\n")
    for r in range(2, 64):
        (marks / f"rank-{r}").write_text("".join(fast))
    assert t > 0
    assert w.check(force=True) == []
    assert json.loads((tmp_path / "stragglers.json").read_text())["stragglers"] == []
    assert set(json.loads((tmp_path / "stragglers.json").read_text())["ranks"]) == {"0", "1"}


def test_one_check_reads_a_bounded_amount_of_marks(tmp_path: Path) -> None:
    """16 ranks each append 1 MB of marks (10**6-step bursts): one check of the watch,
    which runs in the controller's loop, reads at most CHECK_READ_MAX bytes in all."""
    marks = tmp_path / "marks"
    marks.mkdir()
    line = b"1000.000000 step 1\n"
    for r in range(16):
        (marks / f"rank-{r}").write_bytes(line * ((1 << 20) // len(line)))
    folder = straggler.Folder(str(tmp_path))
    folder.read()
    assert sum(rd.last_read for rd in folder.readers.values()) <= straggler.CHECK_READ_MAX


def test_many_entries_in_marks_are_not_all_listed(tmp_path: Path) -> None:
    """A rank fills marks/ with 20000 names: the watch follows at most ENTRIES_MAX files."""
    marks = tmp_path / "marks"
    marks.mkdir()
    for r in range(20000):
        (marks / f"rank-{r}").touch()
    folder = straggler.Folder(str(tmp_path), world=8)
    folder.read()
    assert len(folder.readers) <= 8


HOSTILE_HOST = "gpu\x1b]0;owned\x07\x1b[2J\x9b31m\u2028-17"


def test_a_host_with_control_sequences_prints_as_text(tmp_path: Path) -> None:
    """`treb status`/top lines and the controller's console line say the host name with
    its control characters escaped, never raw ESC/OSC/CSI or a line separator."""
    from trebuchet.cli.report import straggler_lines
    from trebuchet.store.db import RunRecord

    run = tmp_path / "run"
    lockstep(run / "attempt-0", 2, range(12), 1)
    (run / "attempt-0" / "rank-1.json").write_text(
        json.dumps(
            {"label": "rank-1", "rank": 1, "node": 0, "host": HOSTILE_HOST, "state": "RUNNING"}
        )
    )
    rec = RunRecord(id="r1", name="x", backend="local", launcher="native", state="RUNNING",
                    nodes=1, procs_per_node=2, run_dir=str(run), created_at=0.0)  # fmt: skip
    found = straggler_lines(rec)
    assert found and "straggler: rank 1" in found[0], found
    for text in found:
        assert text.isprintable(), repr(text)


def test_a_forged_stragglers_json_is_recomputed_not_shown(tmp_path: Path) -> None:
    """A rank overwrites stragglers.json: a rank that is no number, a score that is a
    string, NaN: status does not fail ("unavailable") but computes it from the marks."""
    from trebuchet.cli.report import straggler_json
    from trebuchet.store.db import RunRecord

    run = tmp_path / "run"
    lockstep(run / "attempt-0", 2, range(12), 1)
    (run / "attempt-0" / "stragglers.json").write_text(
        json.dumps(
            {
                "threshold": 1.3,
                "ranks": {"0": "fast", "1": 1.0, "x\x1b": 9.0},
                "nodes": {},
                "stragglers": ["0", "x\x1b"],
            }
        )
    )
    rec = RunRecord(id="r1", name="x", backend="local", launcher="native", state="RUNNING",
                    nodes=1, procs_per_node=2, run_dir=str(run), created_at=0.0)  # fmt: skip
    data = straggler_json(rec)
    assert data is not None and "error" not in data, data
    assert [s["rank"] for s in data["stragglers"]] == [1]


def test_a_threshold_just_above_1_says_each_rank_once(tmp_path: Path) -> None:
    """straggler_threshold 1.0000001 on an even run with jitter: ranks go in and out of
    the named set every few checks; each is one event (one webhook) per attempt, never a
    flood."""
    w = StragglerWatch(str(tmp_path), 1.0000001, 1)
    t, found = 1000.0, []
    for chunk in range(40):
        t = lockstep(tmp_path, 4, range(5 * chunk, 5 * chunk + 5), None, start=t)
        found += w.check(force=True)
    ranks = [f["rank"] for f in found]
    assert ranks and len(ranks) == len(set(ranks)), ranks


def test_a_checkpoint_line_every_millisecond_is_not_a_mark_each(tmp_path: Path) -> None:
    """A rank prints `Saving model checkpoint to` 10000 times within a second: the agent
    writes one mark for each step number it names per second, not one per line."""
    from trebuchet.runtime.watch.marks import DEFAULT_CHECKPOINT_PATTERN

    hook = LineCheckpoints(str(tmp_path), DEFAULT_CHECKPOINT_PATTERN)
    for _ in range(10000):
        hook("rank-0", b"Saving model checkpoint to /out")
    for _ in range(100):
        hook("rank-0", b"Saving model checkpoint to /out/checkpoint-30")
    text = (tmp_path / "marks" / "rank-0.from-log").read_text().splitlines()
    assert len(text) <= 2, len(text)
    assert text[-1].endswith(" checkpoint 30")


@pytest.mark.parametrize("pattern", ["(a+)+$", "(x|x)*y", "(\\w+\\s?)*$", "(.*a){12}"])
def test_a_catastrophic_pattern_is_refused_by_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pattern: str
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: x\ncheckpoint_pattern: {json.dumps(pattern)}\n")
    assert main(["render", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:2:" in err and "checkpoint_pattern" in err and "Traceback" not in err, err


def test_a_catastrophic_pattern_cannot_stall_the_agent(tmp_path: Path) -> None:
    """A pattern that passed no spec check (an older run's metrics.json) and takes 2**40
    steps on a line: the agent's hook returns (its budget spent, the pattern is turned
    off for the attempt) instead of never; in a child, so a stall fails the test."""
    code = (
        "import sys\n"
        "from trebuchet.runtime.watch.marks import LineCheckpoints\n"
        "for attempt in range(2):  # each attempt's hook: its own budget, its own timer\n"
        "    h = LineCheckpoints(sys.argv[1], r'(a+)+$')\n"
        "    for _ in range(3):\n"
        "        h('rank-0', b'a' * 40 + b'!')\n"
        "    h('rank-0', b'aaaa')\n"
        "    print('off' if h.rx is None else 'on')\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and out.stdout.split() == ["off", "off"], out
    assert "checkpoint_pattern" in out.stderr


@settings(max_examples=150, deadline=None)
@given(
    st.binary(max_size=300)
    | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_a_step_group_on_any_line_gives_finite_marks_or_none(line: bytes) -> None:
    """A spec's `step` group that matches anything (a word, 10**400, nan, NUL): any line
    gives a checkpoint mark with a finite number or none, never an exception."""
    import tempfile

    from trebuchet.runtime.watch.marks import attempt_marks

    with tempfile.TemporaryDirectory() as adir:
        hook = LineCheckpoints(adir, r"checkpoint (?P<step>\S+)")
        hook("rank-0", b"checkpoint " + line)
        hook("rank-0", b"checkpoint 1" + b"0" * 400)
        hook("rank-0", b"checkpoint nan")
        for m in attempt_marks(adir):
            assert m.n is None or math.isfinite(m.n)


def test_a_huge_integer_threshold_is_a_named_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """straggler_threshold: 10**400 in the spec: exit 2 naming the field, no traceback; in
    the run's metrics.json (a rank can rewrite it between attempts): the default, and the
    controller's watch starts."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: x\nstraggler_threshold: {10**400}\n")
    assert main(["render", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:2:" in err and "straggler_threshold" in err and "Traceback" not in err
    (tmp_path / "metrics.json").write_text('{"straggler_threshold": 1' + "0" * 400 + "}")
    assert straggler.threshold_of(str(tmp_path)) == straggler.THRESHOLD
    assert straggler.watch(str(tmp_path), str(tmp_path / "attempt-0"), 1, 2) is not None


@pytest.mark.parametrize("pattern", ["a{99999999999999999999}", "(" * 3000 + ")" * 3000])
def test_a_pattern_that_does_not_compile_is_named_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pattern: str
) -> None:
    """A repetition number past the regex engine's, parentheses nested past the parser's
    recursion: the spec says so (exit 2, the field), and the agent's hook for a rewritten
    metrics.json is none, never an exception that ends the agent."""
    from trebuchet.runtime.watch.marks import checkpoint_lines

    if len(pattern) <= 1000:
        spec = tmp_path / "job.yaml"
        spec.write_text(f"command: x\ncheckpoint_pattern: {json.dumps(pattern)}\n")
        assert main(["render", str(spec)]) == 2
        err = capsys.readouterr().err
        assert "checkpoint_pattern" in err and "Traceback" not in err, err
    assert checkpoint_lines(str(tmp_path), {"checkpoint_pattern": pattern}) is None


def test_dist_mark_with_a_tensor_a_huge_or_odd_number_keeps_the_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A careless rank passes its step as a torch tensor (str: `tensor(7)`), 10**400, NaN,
    a string with a newline: each call is one mark the readers take (with its number where
    it has a finite one), never a line they drop, never a forged second line."""
    import torch

    from trebuchet.dist import mark
    from trebuchet.runtime.watch.marks import parse_marks

    path = tmp_path / "rank-0"
    monkeypatch.setenv("TREB_MARKS", str(path))
    mark("compute", torch.tensor(7))  # type: ignore[arg-type]
    mark("step", torch.tensor(7.0))  # type: ignore[arg-type]
    mark("step", 10**400)
    mark("step", math.nan)
    mark("step", "8\n1 checkpoint 99")  # type: ignore[arg-type]
    found = parse_marks(path.read_bytes())
    assert [(m.kind, m.n) for m in found] == [
        ("compute", 7.0),
        ("step", 7.0),
        ("step", None),
        ("step", None),
        ("step", None),
    ], path.read_text()


def test_a_flood_of_checkpoint_marks_costs_a_bounded_number(tmp_path: Path) -> None:
    """8 ranks each append 4 MB of checkpoint marks (a million in a burst): the readers
    of the goodput and of the no-progress rule (the controller, between attempts) take a
    bounded number of them, the last checkpoint of each rank among them, and progress is
    still seen."""
    from trebuchet.runtime.watch.marks import attempt_marks, progressed

    adir = tmp_path / "attempt-0"
    (adir / "marks").mkdir(parents=True)
    lines = b"".join(b"%d.5 checkpoint %d\n" % (1000 + i, i) for i in range(200000))
    for r in range(8):
        (adir / "marks" / f"rank-{r}").write_bytes(
            lines + b"1300000.5 checkpoint %d\n" % (10**6 + r)
        )
    found = attempt_marks(str(adir))
    assert len(found) <= 8 * 5000, len(found)
    assert {m.n for m in found} >= {10**6 + r for r in range(8)}
    assert progressed(str(tmp_path), 0, 0.0) is True
