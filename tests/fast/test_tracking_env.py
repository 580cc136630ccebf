"""Tracker settings without a server: the ranks' variables, the spec's `tracking:` block,
where the MLflow target comes from, and credentials kept out of the spec."""

from __future__ import annotations

import pytest

from trebuchet.errors import SpecError, UserError
from trebuchet.runtime.publish.trackers import rank_env
from trebuchet.spec.load import load_spec
from trebuchet.tracking import mlflow_target


def _load(tmp_path, text: str):
    return load_spec(tmp_path / "job.yaml", environ={"TOK": "x"}, text=text)


def test_rank_env_mlflow_and_wandb() -> None:
    info = {
        "mlflow": {"uri": "http://h:5000", "experiment_id": 7, "run_id": "abc"},
        "wandb": {"run_id": "treb-1234abcd", "name": "digits", "project": "p", "entity": None,
                  "group": "s1a2b3c4"},
    }  # fmt: skip
    assert rank_env(info) == {
        "MLFLOW_TRACKING_URI": "http://h:5000", "MLFLOW_EXPERIMENT_ID": "7",
        "MLFLOW_RUN_ID": "abc", "WANDB_RUN_ID": "treb-1234abcd", "WANDB_RESUME": "allow",
        "WANDB_NAME": "digits", "WANDB_PROJECT": "p", "WANDB_RUN_GROUP": "s1a2b3c4",
    }  # fmt: skip
    assert rank_env(None) == {}


def test_mlflow_target_from_the_spec_or_the_shell(tmp_path) -> None:
    spec = "name: d\ncommand: x\ntracking: {mlflow: {uri: 'http://h:1', experiment: e}}\n"
    assert mlflow_target(_load(tmp_path, spec), {}) == ("http://h:1", "e")
    plain = _load(tmp_path, "name: d\ncommand: x\n")
    assert mlflow_target(plain, {}) is None
    assert mlflow_target(plain, {"MLFLOW_TRACKING_URI": "http://s:2"}) == ("http://s:2", "d")
    env = {"MLFLOW_TRACKING_URI": "http://s:2", "MLFLOW_EXPERIMENT_NAME": "x"}
    assert mlflow_target(plain, env) == ("http://s:2", "x")
    # a file store in the shell belongs to the script's own mlflow
    assert mlflow_target(plain, {"MLFLOW_TRACKING_URI": "./mlruns"}) is None
    off = _load(tmp_path, "name: d\ncommand: x\ntracking: {mlflow: {enabled: false}}\n")
    assert mlflow_target(off, {"MLFLOW_TRACKING_URI": "http://s:2"}) is None


def test_mlflow_block_without_a_uri_is_refused_with_its_line(tmp_path) -> None:
    loaded = _load(tmp_path, "name: d\ncommand: x\ntracking:\n  mlflow: {experiment: e}\n")
    with pytest.raises(UserError, match=r"job.yaml:4: tracking.mlflow: no uri"):
        mlflow_target(loaded, {})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tracking:\n  mlflow: {uri: 'ftp://h'}\n",
         "job.yaml:3: tracking.mlflow.uri: must be an http:// or https:// URL"),
        ("tracking:\n  wandb: {team: x}\n", "job.yaml:3: tracking.wandb.team"),
        ("env:\n  WANDB_API_KEY: abc123\n", "job.yaml:3: env.WANDB_API_KEY: is a credential"),
        ("env:\n  MLFLOW_TRACKING_TOKEN: t\n", "env.MLFLOW_TRACKING_TOKEN: is a credential"),
    ],
)  # fmt: skip
def test_tracking_spec_errors(tmp_path, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        _load(tmp_path, "command: x\n" + text)


def test_a_credential_may_reference_a_secret(tmp_path) -> None:
    loaded = _load(tmp_path, "command: x\nsecrets: [TOK]\nenv:\n  WANDB_API_KEY: ${TOK}\n")
    assert loaded.spec.env["WANDB_API_KEY"] == "${TOK}"


def test_a_tracking_uri_with_credentials_is_refused(tmp_path) -> None:
    """user:password@host would land in tracking.json; they must come as secrets."""
    spec = "name: d\ncommand: x\ntracking: {mlflow: {uri: 'https://u:pw@h:1'}}\n"
    with pytest.raises(UserError, match="carries credentials"):
        mlflow_target(_load(tmp_path, spec), {})
    plain = _load(tmp_path, "name: d\ncommand: x\n")
    with pytest.raises(UserError, match="MLFLOW_TRACKING_USERNAME"):
        mlflow_target(plain, {"MLFLOW_TRACKING_URI": "http://u:pw@s:2/path"})
    assert mlflow_target(plain, {"MLFLOW_TRACKING_URI": "http://s:2/a@b"}) == (
        "http://s:2/a@b",
        "d",
    )
