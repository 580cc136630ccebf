"""A rank flooding the terminal never delays supervision: the attached view is a thread
beside the supervisor, so a timeout and Ctrl+C are honoured during 64 MB written without a
newline, whether the terminal reads (a pipe drained by the test) or has stopped reading (a
pipe nobody reads). A hang would end in the subprocess timeouts; no timing is asserted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_faults import assert_no_survivors

pytestmark = pytest.mark.integration

FLOOD = 64 << 20
SCRIPT = f"""\
import signal, sys, time
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the timeout's warning: wait for the limit
chunk = b"x" * (1 << 16)
for _ in range({FLOOD >> 16}):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.flush()
time.sleep(300)
"""


class Terminal:
    """The attached `treb run`'s stdout: a pipe drained by a thread ("reads"), or one that
    is full before the run starts and never read (a terminal that stopped reading)."""

    def __init__(self, reads: bool) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.data = bytearray()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        if reads:
            self.thread.start()
        else:
            os.set_blocking(self.write_fd, False)
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(self.write_fd, b"." * 4096)
            os.set_blocking(self.write_fd, True)

    def _drain(self) -> None:
        while chunk := os.read(self.read_fd, 1 << 20):
            self.data += chunk

    def lines(self) -> list[bytes]:
        return self.data.splitlines()

    def close(self) -> None:
        os.close(self.write_fd)
        if self.thread.is_alive():
            self.thread.join(60)  # the run is over: its end of the pipe is closed
        os.close(self.read_fd)


def start(tmp_path: Path, spec_text: str, terminal: Terminal) -> subprocess.Popen:
    script = tmp_path / "flood.py"
    script.write_text(SCRIPT)
    spec = write_spec(tmp_path, f"command: [{sys.executable}, {script}]\n{spec_text}")
    with open(tmp_path / "err", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                                stdout=terminal.write_fd, stderr=err)  # fmt: skip


def finish(proc: subprocess.Popen, terminal: Terminal) -> int:
    try:
        return proc.wait(timeout=30)  # about 3 s when the view keeps apart; 55+ s before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        terminal.close()


def rank_log(st: dict) -> Path:
    return Path(st["run_dir"]) / "attempt-0" / "rank-0.log"


@pytest.mark.parametrize("reads", [True, False], ids=["terminal-reads", "terminal-stalled"])
def test_timeout_fires_during_a_newline_less_flood(reads, treb, tmp_path: Path) -> None:
    terminal = Terminal(reads)
    proc = start(tmp_path, "timeout: 3s\n", terminal)
    assert finish(proc, terminal) == 1
    st = status_json(treb)
    assert st["state"] == "TIMEOUT"
    assert_no_survivors(st["id"])
    assert rank_log(st).stat().st_size == FLOOD  # the log has everything
    if reads:  # what the view showed: bounded pieces of that one line, and notes
        lines = terminal.lines()
        assert lines and all(ln.startswith(b"[0:0] ") for ln in lines)
        assert max(map(len, lines)) < 70_000


@pytest.mark.parametrize("reads", [True, False], ids=["terminal-reads", "terminal-stalled"])
def test_ctrl_c_during_a_newline_less_flood(reads, treb, treb_home: Path, tmp_path: Path) -> None:
    terminal = Terminal(reads)
    proc = start(tmp_path, "", terminal)
    deadline = time.monotonic() + 60
    try:
        while not any(p.stat().st_size >= 16 << 20
                      for p in treb_home.glob("runs/*/attempt-0/rank-0.log")):  # fmt: skip
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "err"
            ).read_text()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
    finally:
        code = finish(proc, terminal)
    assert code == 130
    st = status_json(treb)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    assert_no_survivors(st["id"])
