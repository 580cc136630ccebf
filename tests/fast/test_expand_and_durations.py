"""`${VAR}` expansion rules and duration parsing."""

from __future__ import annotations

import pytest

from trebuchet.spec.duration import parse_duration, slurm_time
from trebuchet.spec.load import load_spec


def test_expansion_defaults_escapes_and_command_untouched(tmp_path) -> None:
    text = (
        "command: echo ${RANK} $HOME\n"
        "env:\n  A: ${TV_A}\n  B: ${TV_NOPE:-fallback}\n  C: cost $${X}\n  D: ${TV_A}-${TV_A}\n"
        "slurm:\n  account: ${TV_A}\n  setup: ['echo ${SLURM_NODEID}']\n"
    )
    loaded = load_spec(tmp_path / "j.yaml", environ={"TV_A": "a1"}, text=text)
    spec = loaded.spec
    assert spec.command == "echo ${RANK} $HOME"
    assert spec.env == {"A": "a1", "B": "fallback", "C": "cost ${X}", "D": "a1-a1"}
    assert spec.slurm.account == "a1"
    assert spec.slurm.setup == ["echo ${SLURM_NODEID}"]


def test_pre_and_post_are_left_to_the_node_shell(tmp_path) -> None:
    """docs/spec.md: like command, pre/post/ssh.setup are never expanded at submission."""
    text = (
        "command: 'true'\npre: mkdir -p /s/${NODE_RANK} ${TV_A}\npost: echo ${NOT_SET_HERE}\n"
        "ssh: {setup: ['echo ${TV_A}']}\n"
    )
    spec = load_spec(tmp_path / "j.yaml", environ={"TV_A": "a1"}, text=text).spec
    assert spec.pre == "mkdir -p /s/${NODE_RANK} ${TV_A}" and spec.post == "echo ${NOT_SET_HERE}"
    assert spec.ssh.setup == ["echo ${TV_A}"]


def test_secret_references_stay_unexpanded(tmp_path) -> None:
    text = "command: x\nsecrets: [TOK]\nenv:\n  WANDB_API_KEY: ${TOK}\n"
    loaded = load_spec(tmp_path / "j.yaml", environ={"TOK": "s3cr3t"}, text=text)
    assert loaded.spec.env["WANDB_API_KEY"] == "${TOK}"


def test_overrides_are_typed_and_validated(tmp_path) -> None:
    loaded = load_spec(
        tmp_path / "j.yaml",
        ["nodes=3", "env.LR=0.1", "slurm.exclusive=true"],
        environ={},
        text="command: x\n",
    )
    assert loaded.spec.nodes == 3
    assert loaded.spec.env["LR"] == "0.1"
    assert loaded.spec.slurm.exclusive is True


def test_name_defaults_to_sanitised_stem(tmp_path) -> None:
    assert (
        load_spec(tmp_path / "My Job_v2.yaml", text="command: x\n", environ={}).spec.name
        == "my-job_v2"
    )


@pytest.mark.parametrize(
    "text,seconds",
    [(90, 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
     ("04:00:00", 14400), ("1-00:00:00", 86400), ("10:30", 630), ("1.5h", 5400)],
)  # fmt: skip
def test_durations(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "1x", -5, 0, True, "1h-3m"])
def test_bad_durations(bad) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_slurm_time_rounds_up_to_minutes() -> None:
    assert slurm_time(90) == "00:02:00"
    assert slurm_time(2 * 86400 + 3600) == "2-01:00:00"
