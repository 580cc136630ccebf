"""A knock-on traceback is folded in the attached view (issue 35, item 5): a rank that
fails because another rank failed first shows its last line and one note, not its whole
traceback before the summary names the cause; the first failing rank's own traceback, and
a traceback with no failure on record, are shown whole. The rank logs keep everything."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TrebFn, write_spec
from trebuchet.view.fold import HOLD_S, Fold

PROGRAM = """\
import os, signal, sys, time

def stopped(signum, frame):  # rank 0 learns of rank 1's failure, as a collective would
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once (a second TERM may follow)
    raise ConnectionResetError("Connection reset by peer [127.0.0.1]:29500")

def step(n):
    time.sleep(0.05)

ready = os.path.join(os.environ["TREB_RUN_DIR"], "rank-0-ready")
if os.environ["RANK"] == "1":
    while not os.path.exists(ready):  # rank 0 handles SIGTERM before rank 1 fails
        time.sleep(0.01)
    print("rank 1 starting", flush=True)
    raise ValueError("corrupt sample in batch 17")
signal.signal(signal.SIGTERM, stopped)
open(ready, "w").close()
while True:
    step(1)
"""


def test_a_knock_on_traceback_is_folded_the_cause_is_not(treb: TrebFn, tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    spec = write_spec(tmp_path, "command: python prog.py\nprocs_per_node: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr
    shown = res.stdout.splitlines()
    assert "[0:1] Traceback (most recent call last):" in shown  # the cause, whole
    assert "[0:1] ValueError: corrupt sample in batch 17" in shown
    assert "[0:0] Traceback (most recent call last):" not in shown, res.stdout
    assert "[0:0] ConnectionResetError: Connection reset by peer [127.0.0.1]:29500" in shown
    note = [ln for ln in shown if ln.startswith("[0:0] [treb: a knock-on failure")]
    assert note and "rank 1 failed first" in note[0] and "--rank 0" in note[0], res.stdout
    run_dir = Path(json.loads(treb("status", "--json").stdout)["run_dir"])
    log = (run_dir / "attempt-0" / "rank-0.log").read_text()
    assert "Traceback (most recent call last):" in log and "in step" in log  # kept whole


def _lines(text: str) -> list[bytes]:
    return [ln.encode() for ln in text.splitlines()]


TRACEBACK = _lines(
    'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    f()\n'
    "RuntimeError: boom"
)


def test_with_no_failure_on_record_a_traceback_is_shown_whole(tmp_path: Path) -> None:
    log = tmp_path / "run1" / "attempt-0" / "rank-0.log"
    log.parent.mkdir(parents=True)
    fold = Fold()
    assert fold.feed(log, [b"epoch 1", *TRACEBACK], 10.0) == [b"epoch 1"]  # held
    assert fold.due(10.0) == []
    assert fold.due(10.0 + HOLD_S) == [(log, TRACEBACK)]
    assert fold.feed(log, [*TRACEBACK, b"epoch 2"], 20.0) == [*TRACEBACK, b"epoch 2"]


def test_a_traceback_after_another_ranks_failure_is_folded(tmp_path: Path) -> None:
    adir = tmp_path / "run1" / "attempt-0"
    adir.mkdir(parents=True)
    (adir / "first-failure").write_text(json.dumps({"label": "3", "rank": 3, "exit_code": 1}))
    fold = Fold()
    mine, theirs = adir / "rank-0.log", adir / "rank-3.log"
    fold.feed(mine, TRACEBACK, 1.0)
    fold.feed(theirs, TRACEBACK, 1.0)
    got = dict(fold.due(1.0 + HOLD_S))
    assert got[theirs] == TRACEBACK  # the first failure's own
    assert got[mine][0] == b"RuntimeError: boom" and len(got[mine]) == 2
    assert (
        b"rank 3 failed first; 3 traceback lines folded (`treb logs run1 --rank 0`)" in got[mine][1]
    )


LINE = st.sampled_from([
    b"Traceback (most recent call last):", b'  File "t.py", line 1, in <module>', b"    f()",
    b"RuntimeError: boom", b"", b"epoch 1", b"[rank0]: Traceback (most recent call last):",
    b"[rank0]:   File \"x.py\", line 2", b"During handling of the above exception, another",
])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(LINE, max_size=8), max_size=8), st.data())
def test_with_no_failure_on_record_nothing_is_lost_or_reordered(batches, data) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "run1" / "attempt-0" / "rank-0.log"
        log.parent.mkdir(parents=True)
        fold, shown, now = Fold(), [], 0.0
        for batch in batches:
            shown += fold.feed(log, batch, now)
            now += data.draw(st.sampled_from([0.0, HOLD_S]))
            shown += [ln for _, lines in fold.due(now) for ln in lines]
        shown += [ln for _, lines in fold.flush() for ln in lines]
        assert shown == [ln for batch in batches for ln in batch]
