"""Ctrl+C while `treb run` records a run, before any supervisor has it: no record is left
PENDING forever (nobody would ever end it) and no record without its run directory. The
SIGINT is a real one, sent by the process to itself at that moment, as a terminal's."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_spec
from trebuchet import runner
from trebuchet.launcher.submit import Submission, prepare
from trebuchet.spec.load import load_spec
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir


@pytest.fixture(autouse=True)
def _python_handles_ctrl_c() -> Iterator[None]:
    """Python's KeyboardInterrupt handler, as under a terminal: a test run started in the
    background by a non-interactive shell inherits SIGINT ignored, and Python keeps it so."""
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, was)


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # Python's handler: KeyboardInterrupt here


class CtrlCOnInsert(Store):
    """A real store; Ctrl+C arrives the moment the run's row is written."""

    def insert_run(self, rec: RunRecord) -> None:
        super().insert_run(rec)
        ctrl_c()


def run_ids() -> list[str]:
    return [row[0] for row in Store().conn.execute("SELECT id FROM runs")]


def test_ctrl_c_just_after_the_record_is_written_leaves_no_record(tmp_path: Path) -> None:
    loaded = load_spec(write_spec(tmp_path, "command: [python, t.py]\n"))
    with pytest.raises(KeyboardInterrupt):
        prepare(loaded, "local", CtrlCOnInsert())
    assert run_ids() == []
    assert not runs_dir().exists() or list(runs_dir().iterdir()) == []


def test_ctrl_c_before_the_supervisor_has_the_run_leaves_no_pending_run(tmp_path: Path) -> None:
    checked = runner.check(write_spec(tmp_path, "command: [python, t.py]\n"), "local")

    def announce(sub: Submission) -> None:
        ctrl_c()

    with pytest.raises(KeyboardInterrupt):
        runner.start(checked, attach=True, announce=announce)
    states = [row[0] for row in Store().conn.execute("SELECT state FROM runs")]
    assert "PENDING" not in states
    assert run_ids() == [] or [p.name for p in runs_dir().iterdir()] == run_ids()


def test_an_attached_run_in_this_process_gives_back_the_signal_handlers(tmp_path: Path) -> None:
    """A run supervised in the caller's process (an attached local run: each point of an
    attached sweep, runner.start) takes SIGINT/SIGTERM/SIGHUP/SIGUSR1/2 for its supervisor;
    once it ended they are the caller's again. Before, the ended supervisor's handler stayed:
    a Ctrl+C after the run (between two sweep points, or in the caller's own code) cancelled
    nothing and raised no KeyboardInterrupt."""
    (tmp_path / "t.py").write_text("pass\n")
    checked = runner.check(write_spec(tmp_path, "command: [python, t.py]\n"), "local")
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    runner.start(checked, attach=True)
    assert {s: signal.getsignal(s) for s in before} == before
    with pytest.raises(KeyboardInterrupt):
        ctrl_c()
