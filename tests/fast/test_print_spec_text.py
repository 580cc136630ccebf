"""`treb run --print-spec SCRIPT ARG...`: the spec it prints is saved and run later, so
whatever the arguments hold (ESC, U+2028, \\r, \\v, quotes, any Unicode) the saved file
must load with treb's own loader and give back exactly the argv typed, and nothing else.

Why: the header comment echoes the command line; an argument holding a character YAML
refuses (ESC) made the saved spec unloadable, and one holding a line break YAML knows
(U+2028, U+2029, U+0085, \\r) ended the comment early, so the rest of the argument was
read as YAML (`x\\u2028retries: 7` set retries). Arguments from a shell may also be bytes
that are not UTF-8 (Python sees them as surrogate escapes): those are refused by name.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trebuchet.cli.main import main
from trebuchet.spec.load import load_spec

# Any text an argv can hold: no NUL (a C string ends there), no lone surrogate (those
# are bytes that are not UTF-8: tested on their own below).
ARG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)
BREAKS = "\x1b\u2028\u2029\x85\r\n\v\f\x1c\x1d\x1e"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "train.py").write_text("import sys\nprint(sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def printed(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["run", "--print-spec", "train.py", *args])
    return rc, out.getvalue(), err.getvalue()


def loads_back(here: Path, text: str, args: list[str]) -> None:
    """The saved spec loads with treb's loader: the same argv, only name, command and
    snapshot (false: it runs in place, as the launch did), and its comment lines are
    comments (nothing between them read as YAML)."""
    path = here / "job.yaml"
    path.write_bytes(text.encode("utf-8"))
    loaded = load_spec(path, cached=False)
    assert loaded.spec.command == ["python", "train.py", *args]
    assert loaded.located is not None and set(loaded.located.data) == {
        "name",
        "command",
        "snapshot",
    }
    assert loaded.spec.retries == 0
    head = text.split("\nname:", 1)[0].split("\n")
    assert all(line.startswith("# ") and line.isprintable() for line in head), head


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(st.one_of(ARG, st.text(st.sampled_from(BREAKS + "ab: #'\"\\${}-"))), max_size=5)
)
def test_any_arguments_load_back_as_the_same_argv(here: Path, args: list[str]) -> None:
    rc, text, err = printed(*args)
    assert rc == 0, err
    loads_back(here, text, args)


@pytest.mark.parametrize(
    "arg",
    ["\x1b[31m", "x\u2028retries: 7", "x\u2029retries: 7", "x\x85retries: 7", "x\rretries: 7",
     "x\vretries: 7", "x\fretries: 7", "'\u2028retries: 7\u2028#", "\u202egnp.exe", "\x1b]0;T\x07"],
)  # fmt: skip
def test_the_adversarys_arguments(here: Path, arg: str) -> None:
    rc, text, err = printed(arg)
    assert rc == 0, err
    loads_back(here, text, [arg])


def test_the_comment_is_the_command_line_as_bash_reads_it(here: Path) -> None:
    """Copied from the comment into bash, the line gives back the same words."""
    args = [
        "\x1b[31m",
        "a\u2028b",
        "it's",
        "\\x41",
        "é中",
        "\x7f",
        "$HOME",
        "\x85\U0001f600\U000e0001",
    ]
    rc, text, _ = printed(*args)
    assert rc == 0
    line = text.splitlines()[0][len("# treb ") :]
    got = subprocess.run(["bash", "-c", f'printf "%s\\0" {line}'], capture_output=True,
                         check=True, env={"LC_ALL": "C.UTF-8"}).stdout  # fmt: skip
    assert got.split(b"\0")[:-1] == [w.encode() for w in ["run", "--print-spec", "train.py", *args]]


def test_a_saved_spec_runs_the_same_argv(here: Path, treb) -> None:
    """The round trip through a real `treb run`: what the script was given is what was typed."""
    args = ["\x1b[31m", "x\u2028retries: 7", "é"]
    res = treb("run", "--print-spec", "train.py", *args, cwd=here)
    assert res.returncode == 0, res.stderr
    (here / "job.yaml").write_text(res.stdout)
    ran = treb("run", str(here / "job.yaml"), cwd=here, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert repr(args) in ran.stdout, ran.stdout


def test_arguments_that_are_not_utf8_are_refused_by_name(here: Path) -> None:
    """Bytes that are not UTF-8 (surrogate escapes in Python) cannot be written in a YAML
    spec: refused, exit 2, no traceback."""
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", "--print-spec", "train.py",
                          b"ok", b"\xff\xfe", b"\x1b\xe2\x80"],
                         capture_output=True, cwd=here, timeout=60)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert b"command[3]" in res.stderr and b"Traceback" not in res.stderr
