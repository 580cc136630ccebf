"""`notify:` webhooks in the spec, and the bodies the controller sends (runtime/publish/webhooks.py).

Why: a webhook's key must never be written in a spec (it would reach the run directory),
a URL must be http(s), an event name must be one the controller sends, and a log pattern
must not be able to backtrack for ever: each is refused before anything runs, with the
file, line and field (exit 2). The bodies' shapes (signed JSON; Slack's {"text"}) are what
receivers parse. The deliveries themselves are tested against a real HTTP receiver in
tests/integration/test_notify.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.errors import SpecError
from trebuchet.runtime.publish import webhooks as notify
from trebuchet.spec.load import load_spec

BASE = "name: hooked\ncommand: echo hi\nnotify:\n"


def _load(tmp_path: Path, hooks: str) -> list[dict]:
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + hooks)
    return [h.model_dump() for h in load_spec(spec, cached=False).spec.notify]


def _refusal(tmp_path: Path, hooks: str) -> str:
    with pytest.raises(SpecError) as exc:
        _load(tmp_path, hooks)
    return "\n".join(exc.value.problems)


def test_a_webhook_with_events_a_log_pattern_and_a_key_name(tmp_path: Path) -> None:
    got = _load(tmp_path, """\
  - url: https://hooks.example.com/treb
    on: [started, failed, hung, {log: "NCCL error"}]
    secret: TREB_HOOK_KEY
""")  # fmt: skip
    assert got == [{"url": "https://hooks.example.com/treb", "secret": "TREB_HOOK_KEY",
                    "on": ["started", "failed", "hung", {"log": "NCCL error"}]}]  # fmt: skip


@pytest.mark.parametrize(
    ("hooks", "line", "field", "why"),
    [
        ("  - url: ftp://files.example.com/x\n    on: [failed]\n", 4, "notify[0].url",
         "an http:// or https:// URL"),
        ("  - url: http://a.example.com/\n    on: [failed, exploded]\n", 5, "notify[0].on",
         "'exploded' is not one of them"),
        ("  - url: http://a.example.com/\n    on: [{log: '(a+)+$'}]\n", 5, "notify[0].on",
         "can backtrack for ever"),
        ("  - url: http://a.example.com/\n    on: []\n", 5, "notify[0].on", "a list of started"),
        ("  - url: http://a.example.com/\n    on: [failed]\n    secret: 9f8e7d6c5b4a3928170\n",
         6, "notify[0].secret", "looks like a key"),
        ("  - url: http://a.example.com/\n    on: [failed]\n    secret: my-webhook-key\n",
         6, "notify[0].secret", "the NAME of an environment variable"),
        ("  - url: http://a.example.com/\n    on: [failed]\n    sekret: KEY\n", 6,
         "notify[0].sekret", "did you mean 'secret'"),
        ("  - url: \"http://a.example.com/\\0x\"\n    on: [failed]\n", 4, "notify[0].url",
         "an http:// or https:// URL"),
        ("  - url: http://a.example.com:99999/\n    on: [failed]\n", 4, "notify[0].url",
         "port"),
    ],
)  # fmt: skip
def test_bad_webhooks_are_refused_with_their_line(
    hooks: str, line: int, field: str, why: str, tmp_path: Path
) -> None:
    said = _refusal(tmp_path, hooks)
    assert f"job.yaml:{line}: {field}:" in said and why in said, said


def test_a_key_written_as_the_secret_is_refused_without_being_echoed(tmp_path: Path) -> None:
    said = _refusal(tmp_path, "  - url: http://a.example.com/\n    on: [failed]\n"
                              "    secret: 9f8e7d6c5b4a3928170\n")  # fmt: skip
    assert "looks like a key" in said and "9f8e7d6c5b4a3928170" not in said, said


def test_the_cli_refuses_a_bad_webhook_with_exit_2_and_no_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "  - url: gopher://x\n    on: [failed]\n")
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "job.yaml:4: notify[0].url:" in res.stderr and "Traceback" not in res.stderr


def test_a_url_kept_in_a_secret_stays_a_reference_on_disk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOOK_URL", "https://hooks.slack.com/services/T0/B0/s3cr3t")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: s\ncommand: echo\nsecrets: [HOOK_URL]\n"
                    "notify:\n  - url: ${HOOK_URL}\n    on: [failed]\n")  # fmt: skip
    loaded = load_spec(spec, cached=False)
    assert loaded.spec.notify[0].url == "${HOOK_URL}"
    from trebuchet.spec import resolved

    assert "s3cr3t" not in resolved.text(loaded)


def test_the_body_is_signed_with_the_hmac_of_its_exact_bytes() -> None:
    body = notify.body("http://r.example.com/", {"run_id": "1", "event": "failed"})
    want = "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert notify.signature(b"k", body) == want
    assert json.loads(body) == {"run_id": "1", "event": "failed"}


def test_a_slack_hook_gets_slacks_text_body() -> None:
    payload = {"run_id": "ab12cd34", "name": "train", "event": "failed", "state": "FAILED",
               "cause": "rank 3 (node 1) exited with code 1", "link": "/runs/ab12cd34"}  # fmt: skip
    got = json.loads(notify.body("https://hooks.slack.com/services/T/B/x", payload))
    assert list(got) == ["text"]
    assert got["text"] == ("treb: run train (ab12cd34) failed: rank 3 (node 1) exited with "
                           "code 1\n/runs/ab12cd34")  # fmt: skip
    assert "text" not in json.loads(notify.body("https://example.com/hooks.slack.com", payload))


def test_events_name_a_hook_by_scheme_and_host_only() -> None:
    assert notify.where("https://hooks.slack.com/services/T/B/s3cr3t") == (
        "https://hooks.slack.com/…"
    )
    assert notify.where("http://127.0.0.1:8080/x?token=1") == "http://127.0.0.1:8080/…"
    assert notify.where("HTTP://Example.COM:443/") == "http://example.com:443"
    assert notify.where("https://user:pw@hooks.slack.com/x") == "?"  # never sent to
    assert notify.shown("${HOOK}", "") == "${HOOK}"  # what it holds is no URL


def test_retry_after_is_read_in_seconds_and_capped_later() -> None:
    assert notify.retry_after("2") == 2.0
    assert notify.retry_after(None) is None
    assert notify.retry_after("Wed, 21 Oct 2026 07:28:00 GMT") == notify.RETRY_AFTER_CAP_S


def test_a_cause_in_one_phrase() -> None:
    assert notify.cause_text({"rank": 3, "node": 1, "exit_code": 1, "host": "tn2"}) == (
        "rank 3 (node 1) exited with code 1 on tn2"
    )
    assert notify.cause_text({"label": "disk", "message": "no space left"}) == "no space left"
    assert notify.cause_text(None) == ""


@pytest.mark.parametrize(
    ("value", "flags", "why"),
    [
        (None, ["--no-check"], "TREB_TEST_HOOK_URL is not set in this shell"),
        ("", [], "TREB_TEST_HOOK_URL is empty"),
        ("ftp://files.example.com/T000/XXXXSECRET", [], "does not hold a URL treb sends to"),
        ("https://user:XXXXSECRET@hooks.example.com/x", [], "does not hold a URL treb sends to"),
    ],
)  # fmt: skip
def test_a_url_secret_that_holds_no_url_is_refused_at_submission(
    value: str | None, flags: list[str], why: str, tmp_path: Path
) -> None:
    """`url: ${NAME}`: what NAME holds where the run is submitted is what the controller
    sends to; none (or no http(s) URL) is refused before anything runs, by the URL's line,
    never quoting the value."""
    spec = tmp_path / "job.yaml"
    spec.write_text('name: s\ncommand: "true"\nsecrets: [TREB_TEST_HOOK_URL]\n'
                    "notify:\n  - url: ${TREB_TEST_HOOK_URL}\n    on: [failed]\n")  # fmt: skip
    env = dict(os.environ)
    env.pop("TREB_TEST_HOOK_URL", None)
    if value is not None:
        env["TREB_TEST_HOOK_URL"] = value
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", *flags, str(spec)],
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "job.yaml:5: notify[0].url: ${TREB_TEST_HOOK_URL}:" in res.stderr and why in res.stderr
    assert "SECRET" not in res.stderr and "Traceback" not in res.stderr


SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30),
    st.sampled_from(["started", "failed", "hung", "https://h.example.com/x", "${HOOK_URL}",
                     "http://a:0/", "TREB_HOOK_KEY", "(a+)+$", "[", "", "\x1b[31m", "\u2028"]),
)  # fmt: skip
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["url", "on", "secret", "log", "x"]), inner, max_size=4),
    ),
    max_leaves=12,
)
URLS = st.one_of(
    st.sampled_from(["https://hooks.slack.com/services/T/B/x", "http://127.0.0.1:8080/h?t=1",
                     "${HOOK_URL}", "${OTHER}", "http://h:99999/", "http://u:p@h/"]),
    st.builds("http://{}/{}".format, st.text(max_size=10), st.text(max_size=10)),
)  # fmt: skip
HOOKS = st.lists(st.fixed_dictionaries(
    {"url": URLS, "on": st.lists(st.one_of(
        st.sampled_from(["started", "succeeded", "failed", "hung", "cancelled", "timeout"]),
        st.fixed_dictionaries({"log": st.one_of(st.text(max_size=12),
                                                st.sampled_from(["NCCL (error|WARN)", "(a+)+"]))}),
    ), min_size=1, max_size=4)},
    optional={"secret": st.one_of(st.sampled_from(["TREB_HOOK_KEY", "9f8e7d6c5b4a39281"]),
                                  st.text(max_size=12))},
), max_size=3)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(VALUE, HOOKS))
def test_any_notify_value_is_a_config_or_a_named_refusal(value: object, tmp_path_factory) -> None:
    """Whatever `notify:` holds: a valid list of webhooks (each URL one treb sends to, or a
    secret's reference), or SpecError's `file:line: notify...: why`; never a traceback."""
    import yaml

    from trebuchet.errors import UserError

    spec = tmp_path_factory.mktemp("spec") / "job.yaml"
    text = yaml.safe_dump({"name": "p", "command": "true", "secrets": ["HOOK_URL"],
                           "notify": value}, allow_unicode=True)  # fmt: skip
    spec.write_text(text)
    try:
        hooks = load_spec(spec, cached=False).spec.notify
    except SpecError as exc:
        assert exc.problems and all(re.match(r".*job\.yaml:\d+: ", p) for p in exc.problems)
        return
    except UserError as exc:  # refused before the fields (the YAML itself)
        assert "job.yaml" in str(exc)
        return
    for hook in hooks:
        assert hook.url == "${HOOK_URL}" or notify.url_problem(hook.url) is None
        assert hook.on and all(o in notify.EVENTS or list(o) == ["log"] for o in hook.on)
