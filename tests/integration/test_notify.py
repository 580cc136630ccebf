"""`notify:` webhooks sent by the job controller to a real HTTP receiver (http.server in
this test) that checks every signature: one POST per event, a 503 retried, Retry-After
honoured, a log pattern, a hang; a dead or unreachable receiver never fails the run.

Why: a webhook is only worth having if it arrives once, signed with the key the spec
names, whatever the receiver does; and a receiver that is down must cost the run nothing
but an event saying what was not sent (assertions on outcomes, never on timings).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.conftest import write_spec

pytestmark = pytest.mark.integration
KEY = "a-key-only-the-environment-holds"


class Receiver:
    """A webhook receiver: records each POST (path, JSON body, whether its signature is
    right); `fail_first[path]` answers 503 (with Retry-After when given) to that many POSTs."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.posts: list[dict] = []
        self.fail_first: dict[str, tuple[int, str | None]] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                want = "sha256=" + hmac.new(KEY.encode(), data, hashlib.sha256).hexdigest()
                with outer.lock:
                    left, after = outer.fail_first.get(self.path, (0, None))
                    if left:
                        outer.fail_first[self.path] = (left - 1, after)
                    outer.posts.append({"path": self.path, "body": json.loads(data),
                                        "signed": self.headers.get("X-Treb-Signature") == want,
                                        "answer": 503 if left else 200})  # fmt: skip
                self.send_response(503 if left else 200)
                if left and after:
                    self.send_header("Retry-After", after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def got(self, path: str) -> list[dict]:
        """The bodies accepted (answered 200) at `path`."""
        with self.lock:
            return [p["body"] for p in self.posts if p["path"] == path and p["answer"] == 200]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def events(run_dir: str, kind: str) -> list[dict]:
    lines = Path(run_dir, "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def run_json(treb, *args: str, env: dict | None = None) -> tuple[dict, object]:
    res = treb("run", *args, env=env)
    got = treb("status", "--json")
    assert got.returncode == 0, res.stderr + got.stderr
    st = json.loads(got.stdout)
    return st, res


def test_each_event_is_posted_once_signed_with_its_cause(treb, tmp_path: Path, receiver) -> None:
    spec = write_spec(tmp_path, f"""\
name: hooked
command: 'echo starting; echo "NCCL error: unhandled system error"; sleep 3; exit 3'
notify:
  - url: {receiver.url}/hook
    on: [started, succeeded, failed, {{log: "NCCL error"}}]
    secret: TREB_TEST_HOOK_KEY
""")  # fmt: skip
    st, res = run_json(treb, str(spec), env={"TREB_TEST_HOOK_KEY": KEY})
    assert res.returncode == 1 and st["state"] == "FAILED", res.stderr
    got = receiver.got("/hook")
    assert [b["event"] for b in got] == ["started", "log", "failed"], got
    assert all(p["signed"] for p in receiver.posts), receiver.posts
    failed = got[-1]
    assert failed["run_id"] == st["id"] and failed["name"] == "hooked"
    assert failed["state"] == "FAILED" and failed["link"] == st["run_dir"]
    assert failed["cause"] == "rank 0 (node 0) exited with code 3", failed
    assert got[1]["line"] == "NCCL error: unhandled system error" and got[1]["pattern"]
    assert len(events(st["run_dir"], "notify_sent")) == 3
    # the key went nowhere on disk
    for path in Path(st["run_dir"]).rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_a_503_is_retried_and_the_event_arrives_once(treb, tmp_path: Path, receiver) -> None:
    receiver.fail_first["/flaky"] = (1, None)
    receiver.fail_first["/later"] = (1, "1")  # Retry-After: 1
    spec = write_spec(tmp_path, f"""\
name: flaky
command: "true"
notify:
  - url: {receiver.url}/flaky
    on: [succeeded]
    secret: TREB_TEST_HOOK_KEY
  - url: {receiver.url}/later
    on: [succeeded]
    secret: TREB_TEST_HOOK_KEY
""")  # fmt: skip
    st, res = run_json(treb, str(spec), env={"TREB_TEST_HOOK_KEY": KEY})
    assert res.returncode == 0 and st["state"] == "SUCCEEDED", res.stderr
    for path in ("/flaky", "/later"):
        assert [b["event"] for b in receiver.got(path)] == ["succeeded"], receiver.posts
        assert [p["answer"] for p in receiver.posts if p["path"] == path] == [503, 200]
    sent = events(st["run_dir"], "notify_sent")
    assert sorted(e["tries"] for e in sent) == [2, 2] and not events(st["run_dir"], "notify_failed")


def test_a_dead_or_unreachable_receiver_never_fails_the_run(treb, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/gone"
    spec = write_spec(tmp_path, f"""\
name: unheard
command: echo working; sleep 1
notify:
  - url: {dead}
    on: [started, succeeded]
  - url: http://192.0.2.1:9/blackhole
    on: [succeeded]
  - url: http://127.0.0.1:1/unsigned
    on: [succeeded]
    secret: TREB_TEST_UNSET_KEY
""")  # fmt: skip
    st, res = run_json(treb, str(spec))
    assert res.returncode == 0 and st["state"] == "SUCCEEDED", res.stderr
    assert "working" in res.stdout
    failed = events(st["run_dir"], "notify_failed")
    by = {(e["url"], e["notify"]): e for e in failed}
    shown = dead.rsplit("/", 1)[0] + "/…"  # scheme, host and port: the path is not written
    assert {(shown, "started"), (shown, "succeeded"), ("http://192.0.2.1:9/…", "succeeded"),
            ("http://127.0.0.1:1/…", "succeeded")} == set(by)  # fmt: skip
    assert len(failed) == 4  # one outcome per event
    assert "TREB_TEST_UNSET_KEY is not set" in by[("http://127.0.0.1:1/…", "succeeded")]["error"]
    assert "Connection refused" in by[(shown, "started")]["error"]


def test_a_url_kept_in_a_secret_is_resolved_only_where_it_is_sent(
    treb, tmp_path: Path, receiver
) -> None:
    spec = write_spec(tmp_path, """\
name: secret-url
command: "true"
secrets: [TREB_TEST_HOOK_URL]
notify:
  - url: ${TREB_TEST_HOOK_URL}
    on: [succeeded]
""")  # fmt: skip
    url = f"{receiver.url}/private-path-token"
    st, res = run_json(treb, str(spec), env={"TREB_TEST_HOOK_URL": url})
    assert st["state"] == "SUCCEEDED", res.stderr
    assert [b["event"] for b in receiver.got("/private-path-token")] == ["succeeded"]
    assert "private-path-token" not in Path(st["run_dir"], "spec.yaml").read_text()
    assert "private-path-token" not in Path(st["run_dir"], "events.jsonl").read_text()


def test_a_trickling_or_redirecting_receiver_costs_its_own_event_only(
    treb, tmp_path: Path, receiver
) -> None:
    """The adversary's receivers: one trickles a header byte every 3 s to `started` (it
    held that request for the whole run, and `failed` was never sent); one answers 302 to
    another port (followed as a GET carrying the signature, recorded as sent). Now:
    `started` is given up at the documented 5 s, `failed` arrives; the redirect is a
    failure and nothing reaches the other port."""
    from tests.slow_http import Hook

    slow, elsewhere = Hook(), Hook()
    slow.trickle_s = 3.0
    slow.answers["/slow"] = [(200, {}, "trickle")]
    slow.answers["/moved"] = [(302, {"Location": f"{elsewhere.uri}/stolen"}, "pass")]
    try:
        spec = write_spec(tmp_path, f"""\
name: trickled
command: sleep 6; exit 1
notify:
  - url: {slow.uri}/slow
    on: [started, failed]
    secret: TREB_TEST_HOOK_KEY
  - url: {slow.uri}/moved
    on: [failed]
    secret: TREB_TEST_HOOK_KEY
""")  # fmt: skip
        st, res = run_json(treb, str(spec), env={"TREB_TEST_HOOK_KEY": KEY})
        assert res.returncode == 1 and st["state"] == "FAILED", res.stderr
        assert [b["event"] for b in slow.got("/slow")] == ["started", "failed"]
        assert elsewhere.posts == []
        records = events(st["run_dir"], "notify_sent") + events(st["run_dir"], "notify_failed")
        assert len(records) == 3, records  # one outcome per event and hook
        got = {(e["event"], e["notify"], e["url"]): e for e in records}
        slow_url = f"{slow.uri}/…"
        assert set(got) == {("notify_failed", "started", slow_url), ("notify_sent", "failed", slow_url),
                            ("notify_failed", "failed", slow_url)}, got  # fmt: skip
        assert got[("notify_failed", "started", slow_url)]["error"] == "no answer within 5 s"
        assert (
            got[("notify_failed", "failed", slow_url)]["error"] == "HTTP 302 redirect not followed"
        )
    finally:
        slow.close()
        elsewhere.close()


def test_a_hang_is_posted_when_it_is_detected(treb, tmp_path: Path, receiver) -> None:
    spec = write_spec(tmp_path, f"""\
name: stuck
command: python -c "import time; print('step 1', flush=True); time.sleep(120)"
hang_timeout: 3s
on_hang: fail
notify:
  - url: {receiver.url}/hang
    on: [hung, failed]
""")  # fmt: skip
    st, res = run_json(treb, str(spec))
    assert st["state"] == "FAILED", res.stderr
    got = receiver.got("/hang")
    assert [b["event"] for b in got] == ["hung", "failed"], got
    assert "no rank made progress" in got[0]["cause"] and got[0]["state"] == "RUNNING"


def test_a_pattern_printed_just_before_the_end_is_still_sent(
    treb, tmp_path: Path, receiver
) -> None:
    spec = write_spec(tmp_path, f"""\
name: last-words
command: 'sleep 0.5; echo "CUDA out of memory. Tried to allocate"; exit 1'
procs_per_node: 2
notify:
  - url: {receiver.url}/last
    on: [failed, {{log: "CUDA out of memory"}}]
""")  # fmt: skip
    st, res = run_json(treb, str(spec))
    assert st["state"] == "FAILED", res.stderr
    got = receiver.got("/last")
    assert sorted(b["event"] for b in got) == ["failed", "log"], got  # one log POST, 2 ranks
