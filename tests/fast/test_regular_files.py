"""A rank can replace its log (or any file of its run directory) with a FIFO or a link to
a device: every reader of such a file returns at once, as for a missing file, because it
opens through runtime/rundir/regular.py. Each reader runs in a thread with a hang guard; the
guard opens the FIFO's other end afterwards so that a blocked reader is released."""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trebuchet.runtime.node.logcopy import _Stream
from trebuchet.runtime.rundir import records
from trebuchet.runtime.rundir.regular import NotRegular, open_regular, read_text
from trebuchet.runtime.watch import activity as progress
from trebuchet.runtime.watch import log_policies as policies
from trebuchet.runtime.watch import stacks

GUARD_S = 10.0


def returns(fn: Callable[[], Any], fifo: Path) -> Any:
    """fn()'s result; fails (instead of hanging the suite) when it blocks on the FIFO."""
    got: dict[str, Any] = {}

    def call() -> None:
        try:
            got["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            got["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(GUARD_S)
    if t.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # release the blocked reader
        os.close(fd)
        t.join(GUARD_S)
        pytest.fail(f"{fn} blocked on a FIFO")
    if "error" in got:
        raise got["error"]
    return got.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    adir = tmp_path / "run" / "attempt-0"
    adir.mkdir(parents=True)
    path = adir / "rank-0.log"
    os.mkfifo(path)
    return path


def test_open_regular_refuses_fifos_devices_and_folders(fifo: Path, tmp_path: Path) -> None:
    (tmp_path / "zero.log").symlink_to("/dev/zero")
    for path in (fifo, tmp_path / "zero.log", tmp_path):
        with pytest.raises(NotRegular):
            returns(lambda p=path: open_regular(p), fifo)
    (tmp_path / "ok.log").write_bytes(b"fine\n")
    assert read_text(tmp_path / "ok.log") == "fine\n"
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing.log")


def test_runtime_readers_skip_a_fifo(fifo: Path) -> None:
    adir = fifo.parent
    reader = progress.Progress(str(adir), on_line=lambda name, line: None)
    reader.track("rank-0")
    returns(lambda: reader.step(force=True), fifo)
    assert returns(lambda: policies._tail(str(fifo)), fifo) == ""
    assert returns(lambda: stacks._read(str(fifo)), fifo) == ""
    assert returns(lambda: records.read_json(str(fifo)), fifo) is None
    assert returns(lambda: _Stream("0", str(fifo)).read(), fifo) == b""
    os.makedirs(stacks.stacks_dir(str(adir)))
    os.mkfifo(os.path.join(stacks.stacks_dir(str(adir)), "rank-1.txt"))
    assert returns(lambda: stacks.answered(str(adir), "1.0-1"), fifo) == {}


def test_view_summary_diagnosis_and_results_skip_a_fifo(fifo: Path) -> None:
    from trebuchet.cli.report import tail_text
    from trebuchet.diagnose import hang, scan
    from trebuchet.results import parse
    from trebuchet.view.follow import Follower

    out = io.BytesIO()
    follower = Follower(out)
    returns(lambda: follower.add("0:0", fifo, tail_lines=5), fifo)
    assert returns(follower.pump, fifo) == 0
    returns(follower.close, fifo)
    assert returns(lambda: tail_text(fifo), fifo) == []
    assert returns(lambda: scan.scan(fifo).last_lines, fifo) == []
    assert returns(lambda: parse.performance(fifo), fifo) is None
    with pytest.raises(OSError):
        returns(lambda: parse.results_csv(fifo), fifo)
    (fifo.parent / "hang.json").symlink_to(fifo)
    assert returns(lambda: hang.read(fifo.parent), fifo) is None
    frame = hang.Frame("f", str(fifo), 3)
    assert returns(lambda: hang._source_call(frame), fifo) is None
