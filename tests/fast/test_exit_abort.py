"""An exit-time abort is named (issue 35, item 4): a rank whose program finished its work
and then aborted in the process's shutdown (torch 2.13 without `destroy_process_group()`:
`terminate called without an active exception`, SIGABRT) is `exit_abort`, with the fix; a
crash during the work stays `aborted` or the Python error it was.

These reproduce the observable without torch (tests/integration/test_exit_abort.py runs the
real torch program, which aborts in about half of its runs): a Python program whose main
returns and whose process then aborts in its C exit handlers (libc's `abort` registered with
`__cxa_atexit`: no Python frame is running at the abort, as in torch's case), after writing
torch's words. Each runs through the real `treb run`."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TrebFn, status_json, write_spec
from trebuchet.diagnose.classify import exit_abort
from trebuchet.diagnose.lines import parse

ABORT_AT_EXIT = """\
import ctypes, sys
print("epoch 3 done; saved model.pt", flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.__cxa_atexit(libc.abort, None, None)  # runs after the interpreter has finished
sys.stderr.write("terminate called without an active exception\\n")
"""

ABORT_DURING_WORK = """\
import os, sys
print("step 1", flush=True)
sys.stderr.write("terminate called without an active exception\\n")
sys.stderr.flush()
os.abort()  # in the middle of the program: its Python stack is not empty
"""

ERROR_THEN_ABORT = """\
import ctypes
print("step 1", flush=True)
libc = ctypes.CDLL("libc.so.6")
libc.__cxa_atexit(libc.abort, None, None)
raise RuntimeError("bad batch")
"""


def _run(treb: TrebFn, tmp_path: Path, program: str, env: str = "") -> tuple[dict, str]:
    (tmp_path / "prog.py").write_text(program)
    spec = write_spec(tmp_path, f"command: python prog.py\n{env}")
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    assert st["first_failure"]["signal"] == "SIGABRT", st["first_failure"]
    return st["diagnosis"]["root_cause"], res.stderr


def test_an_abort_after_the_program_finished_is_exit_abort(treb: TrebFn, tmp_path: Path) -> None:
    root, stderr = _run(treb, tmp_path, ABORT_AT_EXIT)
    assert root["category"] == "exit_abort", root
    assert "destroy_process_group()" in root["remedy"]
    assert "shutdown" in root["summary"] and "finished" in root["summary"]
    assert "cause: exit_abort on rank 0" in stderr


def test_with_faulthandler_an_empty_python_stack_makes_it_certain(
    treb: TrebFn, tmp_path: Path
) -> None:
    root, _ = _run(treb, tmp_path, ABORT_AT_EXIT, "env: {PYTHONFAULTHANDLER: '1'}\n")
    assert root["category"] == "exit_abort", root


def test_an_abort_during_the_work_stays_aborted(treb: TrebFn, tmp_path: Path) -> None:
    root, _ = _run(treb, tmp_path, ABORT_DURING_WORK, "env: {PYTHONFAULTHANDLER: '1'}\n")
    assert root["category"] == "aborted", root
    assert "destroy_process_group" not in root["remedy"]


def test_a_python_error_then_an_abort_at_exit_is_the_error(treb: TrebFn, tmp_path: Path) -> None:
    root, _ = _run(treb, tmp_path, ERROR_THEN_ABORT)
    assert root["category"] == "python_exception", root
    assert "bad batch" in root["summary"]


# A rank of torch 2.13's gloo program without destroy_process_group() under
# PYTHONFAULTHANDLER=1, as torchrun's terminal showed it here (2 of 6 runs aborted so).
TORCH_AT_EXIT = """\
done 1
terminate called without an active exception
Fatal Python error: Aborted

Thread 0x00007f55b2c4fb80 (most recent call first):
  <no Python frame>

Extension modules: numpy._core._multiarray_umath, torch._C, torch._C._nn (total: 3)
"""


def test_faulthandler_dump_with_no_python_frame_is_certain() -> None:
    lines = [parse(t) for t in TORCH_AT_EXIT.splitlines()]
    assert exit_abort(lines) == "certain"
    during = TORCH_AT_EXIT.replace(
        "  <no Python frame>", '  File "/w/train.py", line 6 in <module>'
    )
    assert exit_abort([parse(t) for t in during.splitlines()]) is None
    words_after = ["terminate called without an active exception", "step 7 loss 0.1"]
    assert exit_abort([parse(words_after[0])], words_after) is None
    assert exit_abort([parse(words_after[0])], words_after[:1]) == "likely"
