"""The webhook sender (runtime/publish/webhooks.py) against a real local HTTP receiver
(tests/slow_http.py's Hook): what a hostile or broken receiver can and cannot do.

Why: a webhook carries a signature and sometimes a secret URL. A redirect must never take
either elsewhere (nor count as delivered); a receiver that trickles its answer must not hold
the sender past the documented per-request deadline (later events, `failed` above all,
still go out); a URL's path, query and user info (a Slack hook's path is its credential)
must never reach events.jsonl, whatever error the URL causes; and each event has exactly
one outcome record. Assertions are on what the receiver got and what events.jsonl says,
never on timings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import needs_program
from tests.slow_http import Hook, wait_until
from trebuchet.runtime.publish import webhooks as notify

KEY = "a-key-only-the-environment-holds"
TOKEN = "XXXXSECRETXXXX"


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def other() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.close()


def send(run_dir: Path, hooks: list[dict], events: list[str], wait: float = notify.END_WAIT_S,
         secrets: tuple[str, ...] = (), ready: Callable[[], bool] | None = None) -> list[dict]:  # fmt: skip
    """The events sent as the job controller sends them (event, then close at the run's
    end, once `ready()`), once every sender has ended; the outcome records of events.jsonl."""
    run_dir.mkdir(exist_ok=True)
    notifier = notify.Notifier(str(run_dir), {"name": "t", "notify": hooks,
                                              "secrets": list(secrets)})  # fmt: skip
    for event in events:
        notifier.event(event, event.upper(), "why")
    if ready is not None:
        wait_until(ready, what="the receiver has the request")
    notifier.close(wait)
    for sender in notifier.senders:  # what it does after the end counts too
        sender.join(30)
        assert not sender.is_alive()
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["event"].startswith("notify_")]


def outcomes(records: list[dict]) -> list[tuple[str, str]]:
    return sorted((r["notify"], r["event"]) for r in records)


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed(code: int, hook: Hook, other: Hook, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("TREB_TEST_HOOK_KEY", KEY)
    hook.answers["/hook"] = [(code, {"Location": f"{other.uri}/elsewhere"}, "pass")]
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["failed"],
                                   "secret": "TREB_TEST_HOOK_KEY"}], ["failed"])  # fmt: skip
    assert other.posts == [], other.posts  # neither the body nor the signature went there
    assert len(hook.posts) == 1
    assert outcomes(got) == [("failed", "notify_failed")], got
    assert f"{code} redirect not followed" in got[0]["error"], got


def test_a_trickling_receiver_is_cut_at_the_deadline_and_later_events_still_go(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One byte of the answer every 0.5 s: no socket timeout ever fires, the total one does
    (TIMEOUT_S, shortened here to keep the test short); `failed` is sent after it."""
    monkeypatch.setattr(notify, "TIMEOUT_S", 1.5)
    hook.trickle_s = 0.5
    hook.answers["/hook"] = [(200, {}, "trickle")]
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["started", "failed"]}],
               ["started", "failed"])  # fmt: skip
    assert [b["event"] for b in hook.got()] == ["started", "failed"]  # started: not resent
    assert outcomes(got) == [("failed", "notify_sent"), ("started", "notify_failed")], got
    assert "no answer within 1.5 s" in got[[r["notify"] for r in got].index("started")]["error"]


def test_a_request_in_flight_at_the_runs_end_leaves_the_end_its_share(
    hook: Hook, tmp_path: Path
) -> None:
    """`started` hangs (the documented 5 s per request), the run ends at once: `started` is
    cut so that `failed` still goes out within the end's wait."""
    hook.answers["/hook"] = [(200, {}, "hang")]
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["started", "failed"]}],
               ["started", "failed"], ready=lambda: len(hook.posts) == 1)  # fmt: skip
    assert outcomes(got) == [("failed", "notify_sent"), ("started", "notify_failed")], got


def test_a_hanging_receiver_gets_one_outcome_per_event(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In flight when the run ends: the end's wait gives it up, and the request (which
    would have timed out later) adds no second record."""
    monkeypatch.setattr(notify, "TIMEOUT_S", 2.0)
    hook.answers["/hook"] = [(200, {}, "hang")]
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["failed"]}], ["failed"],
               wait=0.5, ready=lambda: len(hook.posts) == 1)  # fmt: skip
    assert outcomes(got) == [("failed", "notify_failed")], got


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/services/T000/B000/" + TOKEN + " x",  # http.client: InvalidURL
        "http://127.0.0.1:{port}/services/T000/B000/" + TOKEN + "\x01",
        "http://127.0.0.1:{port}:1/" + TOKEN,
        "http://127.0.0.1:99999/" + TOKEN,
        "http://[::1/" + TOKEN,
        "http://user:" + TOKEN + "@127.0.0.1:{port}/x?token=" + TOKEN,
        "http://127.0.0.1:{port}/hook?token=" + TOKEN + "#" + TOKEN,
        "http://" + TOKEN + ".invalid/x",
        "ftp://127.0.0.1:{port}/" + TOKEN,
        TOKEN,
    ],
)  # fmt: skip
def test_a_secret_urls_path_never_reaches_the_events(
    url: str, hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook.answers["/hook"] = [(500, {}, "pass")] * 3
    monkeypatch.setenv("TREB_TEST_HOOK_URL", url.format(port=hook.port))
    got = send(tmp_path / "run", [{"url": "${TREB_TEST_HOOK_URL}", "on": ["failed"]}],
               ["failed"], secrets=("TREB_TEST_HOOK_URL",))  # fmt: skip
    text = (tmp_path / "run" / "events.jsonl").read_text()
    assert "SECRET" not in text and "T000" not in text, text
    assert len(got) == 1, got
    assert got[0]["url"] == "${TREB_TEST_HOOK_URL}" or re.fullmatch(
        r"https?://[a-z0-9.\[\]:-]+(:[0-9]+)?(/…)?", got[0]["url"]
    ), got


def test_a_url_from_a_secret_is_named_by_its_host_not_mangled(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREB_TEST_HOOK_URL", f"{hook.uri}/p/{TOKEN}")
    got = send(tmp_path / "run", [{"url": "${TREB_TEST_HOOK_URL}", "on": ["failed"]}],
               ["failed"], secrets=("TREB_TEST_HOOK_URL",))  # fmt: skip
    assert [(r["event"], r["url"]) for r in got] == [("notify_sent", f"{hook.uri}/…")], got
    assert hook.posts[0]["path"] == f"/p/{TOKEN}"


def test_the_signature_is_the_hmac_of_the_bytes_received(
    hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREB_TEST_HOOK_KEY", KEY)
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["failed"],
                                   "secret": "TREB_TEST_HOOK_KEY"}], ["failed"])  # fmt: skip
    post = hook.posts[0]
    want = "sha256=" + hmac.new(KEY.encode(), post["body"], hashlib.sha256).hexdigest()
    assert post["method"] == "POST" and post["headers"]["x-treb-signature"] == want
    assert [(r["event"], r["status"], r["tries"]) for r in got] == [("notify_sent", 200, 1)]


@pytest.fixture
def tls_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    """An HTTPS receiver whose self-signed certificate (for 127.0.0.1) the sender trusts
    (SSL_CERT_FILE, read by ssl.create_default_context)."""
    import ssl
    import subprocess

    openssl = needs_program("openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    h = Hook(tls=context)
    yield h
    h.close()


def test_https_is_sent_and_a_trickling_https_receiver_is_cut(
    tls_hook: Hook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notify, "TIMEOUT_S", 1.5)
    tls_hook.trickle_s = 0.5
    tls_hook.answers["/hook"] = [(200, {}, "trickle")]
    got = send(tmp_path / "run", [{"url": f"{tls_hook.uri}/hook", "on": ["started", "failed"]}],
               ["started", "failed"])  # fmt: skip
    assert [b["event"] for b in tls_hook.got()] == ["started", "failed"]
    assert outcomes(got) == [("failed", "notify_sent"), ("started", "notify_failed")], got
    assert got[0]["url"] == f"{tls_hook.uri}/…"


def test_a_500_is_tried_three_times_then_one_failure(hook: Hook, tmp_path: Path) -> None:
    hook.answers["/hook"] = [(500, {}, "pass")] * 5
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["failed"]}], ["failed"])
    assert len(hook.posts) == 3
    assert [(r["event"], r["tries"]) for r in got] == [("notify_failed", 3)], got
    assert got[0]["error"] == "HTTP 500"


def test_a_4_gb_answer_is_not_read(hook: Hook, tmp_path: Path) -> None:
    """The status is all that counts: the body announced is never waited for."""
    hook.answers["/hook"] = [(200, {"body_bytes": str(4 << 30)}, "pass")]
    got = send(tmp_path / "run", [{"url": f"{hook.uri}/hook", "on": ["failed"]}], ["failed"])
    assert [(r["event"], r["status"]) for r in got] == [("notify_sent", 200)], got


URLISH = st.text(st.sampled_from("htps:/@?#[]%.:-_~=&;+!$'()*, \t\r\n\x00\u2028é中0123456789abcAB"))
HOST = st.text(st.sampled_from("abcXYZ019.-"), min_size=1, max_size=20)
PORT = st.one_of(st.just(""), st.integers(0, 99999).map(lambda p: f":{p}"))


@settings(max_examples=200, deadline=None)
@given(url=st.one_of(
    st.text(), URLISH,
    st.builds("{}://{}{}{}".format, st.sampled_from(["http", "HTTPS", "ftp", ""]), HOST, PORT,
              st.one_of(st.just(""), st.builds("/{}".format, st.one_of(URLISH, st.text())))),
    st.builds("{}://{}@{}{}/{}".format, st.sampled_from(["http", "https"]), URLISH, HOST, PORT,
              URLISH),
))  # fmt: skip
def test_a_redacted_url_holds_its_scheme_host_and_port_only(url: str) -> None:
    """Whatever the string, what events record of it is `scheme://host[:port]` (and `/…`
    where a path or query followed), or "?" (not a URL treb sends to): nothing of its path,
    query, fragment or user info, and nothing a terminal would not show as text."""
    shown = notify.where(url)
    if shown == "?":
        assert notify.url_problem(url), url
        return
    assert notify.url_problem(url) is None
    m = re.fullmatch(r"(https?)://([a-z0-9.-]+)(?::([0-9]{1,5}))?(/…)?", shown)
    assert m, shown
    scheme, rest = url.split("://", 1)
    assert m.group(1) == scheme.lower() and rest.lower().startswith(m.group(2))
    after = rest[len(m.group(2)) :]
    port = re.match(r":([0-9]+)", after)
    assert m.group(3) == (str(int(port.group(1))) if port else None)
    assert (m.group(4) is not None) == (after[port.end() if port else 0 :] not in ("", "/"))
