"""A command that expands to nothing is refused before anything is recorded (issue 25:
`command: ${cmd}` with cmd unset ran nothing and ended SUCCEEDED in 0.0 s), on every engine:
validation does it (spec/command.py), where `${VAR}` elsewhere in the spec is expanded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TrebFn, write_spec


def _refused(res, line: int, *fragments: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert f"job.yaml:{line}: command: " in res.stderr, res.stderr
    for fragment in fragments:
        assert fragment in res.stderr, res.stderr


@pytest.mark.parametrize("on", ["local", "slurm", "kubernetes", "skypilot", "ssh"])
def test_unset_variable_is_refused_on_every_engine(on: str, treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: e\ncommand: ${UNSET_CMD_X}\n")
    res = treb("render", str(spec), "--on", on, env={"UNSET_CMD_X": ""})
    _refused(res, 2, "'${UNSET_CMD_X}' expands to nothing", "UNSET_CMD_X is unset")


def test_run_records_nothing(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: e\nnodes: 1\ncommand: $A ${B}  \n")
    res = treb("run", str(spec))
    _refused(res, 3, "'$A ${B}' expands to nothing: A, B are unset")
    assert json.loads(treb("ps", "--all", "--json").stdout) == []


def test_blank_command_is_refused(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, 'name: e\ncommand: "   "\n')
    _refused(treb("run", str(spec)), 2, "must be a non-empty string")


@pytest.mark.parametrize(
    "text,env",
    [
        ("command: ${CMD}\nenv:\n  CMD: echo hi\n", {}),  # set by the spec
        ("command: ${CMD}\n", {"CMD": "echo hi"}),  # by the submitting shell
        ("command: $RANK\n", {}),  # trebuchet sets it in every rank
        ("command: $CMD\nslurm:\n  setup: ['export CMD=\"echo hi\"']\n", {}),  # a setup line
        ("command: ${CMD:-echo default}\n", {}),  # not a plain reference
        ("command: echo ${CMD}\n", {}),  # something runs
        ("command: ['${CMD}']\n", {}),  # no shell: the program '${CMD}' is not found
    ],
)
def test_commands_that_run_something_pass(text: str, env: dict, treb: TrebFn,
                                          tmp_path: Path) -> None:  # fmt: skip
    spec = write_spec(tmp_path, "name: e\n" + text)
    res = treb("render", str(spec), env={"CMD": "", **env})
    assert res.returncode == 0, res.stderr


def test_cached_spec_is_refused_once_the_variable_is_gone(treb: TrebFn, tmp_path: Path) -> None:
    """The spec cache keys an entry on the variables validation read: this one included."""
    spec = write_spec(tmp_path, "name: e\ncommand: ${CMD}\n")
    assert treb("render", str(spec), env={"CMD": "echo hi"}).returncode == 0
    _refused(treb("render", str(spec), env={"CMD": " "}), 2, "CMD is unset or empty")


def test_an_override_is_named(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: e\ncommand: echo hi\n")
    res = treb("render", str(spec), "-o", "command=${NOPE_X}", env={"NOPE_X": ""})
    assert res.returncode == 2 and "-o command=${NOPE_X}: command: " in res.stderr, res.stderr


@pytest.mark.parametrize(
    "cmd", ["${X_NOPE:-}", "${X_NOPE-}", "${X_NOPE:=}", "${X_NOPE:-  }", "${X_NOPE:-} $Y_NOPE"]
)
def test_an_empty_default_is_refused(cmd: str, treb: TrebFn, tmp_path: Path) -> None:
    """Issue 33: `${X:-}` (a default that is empty) ran and SUCCEEDED in 0.0 s, while
    `$NOPE` was refused: both expand to nothing in bash on the node."""
    spec = write_spec(tmp_path, f"name: e\nnodes: 1\ncommand: '{cmd}'\n")
    res = treb("run", str(spec), env={"X_NOPE": "", "Y_NOPE": ""})
    _refused(res, 3, "expands to nothing", "X_NOPE")
    assert json.loads(treb("ps", "--all", "--json").stdout) == []
