"""The adversary's second pass on the empty command (issue 33: `command: ${X:-}` ran and
SUCCEEDED in 0.0 s): each of these commands ran nothing in bash on the node and the run
SUCCEEDED in 0.0 s; now each is refused at validation, exit 2, naming the variable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TrebFn, write_spec
from trebuchet.spec.command import empty_expansion

NOTHING = [
    "'${X_NOPE:-$Y_NOPE}'",  # a default that is itself an unset reference
    "'${X_NOPE:-${Y_NOPE:-}}'",
    "'${X_NOPE:+python train.py}'",  # the word runs only when X_NOPE is set
    "'exec $X_NOPE'",  # exec, eval, command with no words: exit 0
    "'eval \"$X_NOPE\"'",
    "'exec ${X_NOPE:-}'",
    "[bash, -c, '$X_NOPE']",  # a list whose shell line expands to nothing
    "[/bin/sh, -c, '${X_NOPE:-}', argv0]",
]


@pytest.mark.parametrize("cmd", NOTHING)
def test_a_command_that_runs_nothing_is_refused(cmd: str, treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, f"name: e\nnodes: 1\ncommand: {cmd}\n")
    res = treb("run", str(spec), env={"X_NOPE": "", "Y_NOPE": ""})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "job.yaml:3: command: " in res.stderr and "expands to nothing" in res.stderr
    assert "X_NOPE" in res.stderr, res.stderr
    assert json.loads(treb("ps", "--all", "--json").stdout) == []


@pytest.mark.parametrize(
    "command,env",
    [
        ("${X:-$Y}", {"Y": "echo hi"}),  # the default's reference is set
        ("${X:+python train.py}", {"X": "1"}),  # set: the word runs
        ("exec python train.py", {}),
        ("eval $X", {"X": "echo hi"}),
        (["bash", "-c", "$X"], {"X": "echo hi"}),
        (["bash", "-c", "echo $X"], {}),
        (["bash", "-x"], {}),  # no -c string: bash reads stdin, not ours to judge
        (["python", "-c", "$X"], {}),  # not a shell
        ("${X:-''}", {}),  # a quoted empty word: bash runs '' (not found, exit 127)
        ("$X; $Y", {}),  # a lone ; is bash's syntax error, exit 2
    ],
)
def test_commands_that_run_something_or_fail_pass(command: str | list[str],
                                                  env: dict[str, str]) -> None:  # fmt: skip
    assert empty_expansion(command, {}, env) is None


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            [
                "exec ",
                "eval ",
                "${X:-",
                "${Y:+",
                "$X",
                "${",
                "}",
                "$",
                "{",
                ":",
                "-",
                "+",
                "=",
                "@",
                "*",
                "1",
                " ",
                "X",
                "'",
                '"',
                ";",
                "a",
                "\n",
            ]
        ),
        max_size=12,
    ).map("".join),  # fmt: skip
    listed=st.booleans(),
)
def test_any_command_text_is_judged_without_an_error(text: str, listed: bool) -> None:
    """Total on any text: a reason naming what it read, or None."""
    command: str | list[str] = ["bash", "-c", text] if listed else text
    why = empty_expansion(command, {"Y": ""}, {"X": ""})
    assert why is None or "expands to nothing" in why
