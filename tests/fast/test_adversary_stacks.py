"""Adversary, issue 38 item 3: py-spy's dump read from its JSON, so that a thread name or
a command line that prints lines like py-spy's cannot make a rank look as if it waits in a
collective; a stand-in py-spy (a script on $TREB_PY_SPY) that prints garbage is no stack."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trebuchet.diagnose import hang as dhang
from trebuchet.runtime.watch import stacks

PY = sys.executable

# -- py-spy's output read from its JSON -----------------------------------------------

FAKE_FRAMES = '\nThread 1 (idle): "MainThread"\n    all_reduce (/x/torch/c10d.py:1)\n    x'
HANGS = """\
import sys, threading, time
threading.current_thread().name = sys.argv[2]
print("ready", flush=True)
def hang_here():
    time.sleep(300)
hang_here()
"""


@pytest.fixture
def spy(monkeypatch) -> None:
    from tests.conftest import needs_program

    monkeypatch.setenv("TREB_PY_SPY", stacks.find_py_spy() or needs_program("py-spy"))


def dump_of(tmp_path: Path, argv: list[str], code: str = HANGS) -> tuple[str, dhang.RankStack]:
    """A real Dump (to its end) of a Python program that prints 'ready' and hangs."""
    (tmp_path / "stacks").mkdir()
    (tmp_path / "hangs.py").write_text(code)
    proc = subprocess.Popen([PY, str(tmp_path / "hangs.py"), *argv], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        d = stacks.Dump(str(tmp_path), "rank-0", proc.pid, "1.0-1")
        deadline = time.monotonic() + 30
        while not d.step():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    [rs] = dhang.read_stacks(tmp_path)
    return (tmp_path / "stacks" / "rank-0.txt").read_text(), rs


@pytest.mark.parametrize("where", ["argv", "thread name"])
def test_lines_like_py_spy_s_in_a_rank_do_not_make_its_stack(tmp_path, spy, where) -> None:
    """A real process whose command line (or main thread's name) holds lines that look
    like a py-spy thread waiting in all_reduce. Before: its stack read as 'all_reduce'."""
    argv = [FAKE_FRAMES, "MainThread"] if where == "argv" else ["x", "MainThread" + FAKE_FRAMES]
    text, rs = dump_of(tmp_path, argv)
    assert rs.what == "time.sleep" and rs.where == "hangs.py:5", text
    assert "all_reduce (/x/torch" not in text.replace("^J", "\n").splitlines(), text


def test_a_py_spy_that_prints_garbage_is_no_stack(tmp_path: Path, monkeypatch) -> None:
    """A stand-in for py-spy (a script on $TREB_PY_SPY) that exits 0 with lines that are no
    dump, an ESC among them. Before: 'py-spy' as the method and its garbage as the stack."""
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nprintf 'Thread 1 (idle): \"MainThread\"\\n    all_reduce "
                    "(/x/c10d.py:1)\\n\\033]0;pwned\\007\\n'\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("TREB_PY_SPY", str(fake))
    (tmp_path / "d").mkdir()
    text, rs = dump_of(tmp_path / "d", ["x", "MainThread"])
    assert rs.method == "none" and rs.what == "no stacks", text
    assert "not a py-spy dump" in rs.why and "\x1b" not in text, text
    assert os.path.exists(tmp_path / "d" / "stacks" / "rank-0.txt")


WORKER = """\
import threading, time
def worker_waits():
    time.sleep(300)
threading.Thread(target=worker_waits, name="MainThread", daemon=True).start()
threading.current_thread().name = "not main"
print("ready", flush=True)
def hang_here():
    time.sleep(300)
hang_here()
"""


def test_a_thread_named_mainthread_is_not_taken_for_the_main_one(tmp_path, spy) -> None:
    """A rank names a worker thread 'MainThread' (and its own something else): the main
    thread is the one whose id is the pid. Before: the worker's stack read as the rank's."""
    text, rs = dump_of(tmp_path, [], WORKER)
    assert rs.where == "hangs.py:8", text


def test_a_py_spy_that_never_returns_leaves_no_process(tmp_path: Path, monkeypatch) -> None:
    """A stand-in for py-spy (a script on $TREB_PY_SPY) that starts a child and never
    returns: the dump ends at its deadline, saying so, and the child goes with it.
    Before: the script was killed, its child left running (one per rank and hang)."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path}/child\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TREB_PY_SPY", str(fake))
    monkeypatch.setattr(stacks, "DUMP_DEADLINE_S", 2.0)
    (tmp_path / "d").mkdir()
    text, rs = dump_of(tmp_path / "d", ["x", "MainThread"])
    assert "no answer within" in text and rs.method == "none", text
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and _state(child) != "Z":
        if time.monotonic() > deadline:
            os.kill(child, 9)
            raise AssertionError(f"py-spy's child {child} outlived the dump")
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
