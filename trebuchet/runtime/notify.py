"""The spec's `notify:` webhooks, sent by the job controller (runtime/lifecycle.py): a run's
start, its end (succeeded, failed, timeout, cancelled), a hang when it is detected, and a
log pattern when a rank prints it (docs/notify.md).

Why a module of the runtime: the controller runs locally, beside ssh hosts and in a Slurm
batch step, so the sending is written once, with urllib (stdlib only, Python >= 3.8).
Never delaying supervision: each webhook has a daemon thread that sends its events in
order (short timeouts, a few retries with backoff on 5xx / 429 / connection errors,
Retry-After honoured within a cap); the controller only puts events on its queue. At the
run's end the controller waits at most END_WAIT_S for what is still queued; a send that
gives up is an event (`notify_failed`) in events.jsonl, never silently lost.

The HMAC key is the value of the environment variable the spec names (`secret`): it is
read here, in the controller's process (which inherits the submitting environment on
every engine: the supervisor, sbatch's --export=ALL), and never written anywhere. A URL
may itself be a secret (`url: ${SLACK_HOOK}` with SLACK_HOOK under `secrets:`): it is
resolved here the same way, and events name only its scheme and host.

Log patterns are searched by a child interpreter (policies.Matcher, the log policies'
one) killed after a timeout, over the bytes new since the last look, every LOG_STEP_S:
a pattern that backtracks costs a killed child, never the controller's time.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Dict

from . import policies, secrets
from .contracts import NOTIFY_EVENTS
from .records import append_event

if TYPE_CHECKING:
    from .contracts import FirstFailure

EVENTS = NOTIFY_EVENTS
TIMEOUT_S = 5.0  # one request
TRIES = 3  # a send's requests at most (the first and two retries)
BACKOFF_S = 0.5  # doubled after each failed try
RETRY_AFTER_CAP_S = 10.0  # a Retry-After longer than this is cut to it
END_WAIT_S = 5.0  # the run's end waits at most this long for queued sends
WARM_AFTER_S = 1.0  # a sender idle this long imports urllib, ready for the run's end
LOG_STEP_S = 2.0  # how often the logs are searched for the `log:` patterns
LAST_LOOK_S = 1.0  # the attempt's end waits at most this long for the last look
SCAN_BYTES = policies.SCAN_BYTES  # a log's new bytes read per look at most
SIGNATURE = "X-Treb-Signature"
SLACK_HOSTS = ("hooks.slack.com",)

Hook = Dict[str, Any]  # one item of the spec's notify: {url, on, secret}


def hooks_of(spec: dict[str, Any]) -> list[Hook]:
    """The spec's webhooks (its spec.json: secrets as names only)."""
    return [h for h in spec.get("notify") or [] if isinstance(h, dict) and h.get("url")]


def signature(key: bytes, body: bytes) -> str:
    """The X-Treb-Signature value: sha256=<hex HMAC-SHA256 of the exact body>."""
    import hashlib
    import hmac

    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def where(url: str) -> str:
    """scheme://host[:port] of a URL: what events name (a hook's path may be a credential)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "?"


def is_slack(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        return (urlsplit(url).hostname or "") in SLACK_HOSTS
    except ValueError:
        return False


def wanted(hook: Hook, event: str) -> bool:
    return any(o == event for o in hook.get("on") or [] if isinstance(o, str))


def patterns(hook: Hook) -> list[str]:
    return [o["log"] for o in hook.get("on") or [] if isinstance(o, dict) and "log" in o]


def link(run_dir: str, run_id: str) -> str:
    """The dashboard's page of the run when TREB_DASHBOARD_URL says where it is, else the
    run directory."""
    base = os.environ.get("TREB_DASHBOARD_URL", "").rstrip("/")
    return f"{base}/runs/{run_id}" if base.startswith(("http://", "https://")) else run_dir


def cause_text(cause: FirstFailure | None) -> str:
    """A first failure in one phrase: its message, or who ended how and where."""
    if not cause:
        return ""
    if cause.get("message"):
        return str(cause["message"])
    rank, node = cause.get("rank"), cause.get("node")
    who = str(cause.get("label") or "a process")
    if rank is not None:
        who = f"rank {rank}" + (f" (node {node})" if node is not None else "")
    how = (f"killed by {cause['signal']}" if cause.get("signal")
           else f"exited with code {cause.get('exit_code')}")  # fmt: skip
    host = f" on {cause['host']}" if cause.get("host") else ""
    return f"{who} {how}{host}"


def body(hook_url: str, payload: dict[str, Any]) -> bytes:
    """The request's body: the payload as JSON, or Slack's {"text": ...} for a Slack hook."""
    if is_slack(hook_url):
        words = f"treb: run {payload['name']} ({payload['run_id']}) {payload['event']}"
        if payload.get("cause"):
            words += f": {payload['cause']}"
        if payload.get("line"):
            words += f"\n> {payload['line']}"
        payload = {"text": f"{words}\n{payload['link']}"}
    return json.dumps(payload, sort_keys=True).encode()


class Sender(threading.Thread):
    """One webhook's sends, in order, in a daemon thread (see the module's docstring)."""

    def __init__(self, run_dir: str, hook: Hook, names: list[str]) -> None:
        super().__init__(name="treb-notify", daemon=True)
        self.run_dir, self.hook, self.names = run_dir, hook, names
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.lock = threading.Lock()
        self.pending: list[str] = []  # the events queued or in flight
        self.deadline: float | None = None  # monotonic: set by the run's end

    def put(self, payload: dict[str, Any]) -> None:
        with self.lock:
            self.pending.append(str(payload["event"]))
        self.begin()
        self.queue.put(payload)

    def begin(self) -> None:
        if self.ident is None:
            self.start()

    def left(self) -> float:
        return TIMEOUT_S if self.deadline is None else self.deadline - time.monotonic()

    def run(self) -> None:
        try:  # idle a while (the launch's burst): urllib is imported before the run's end
            payload = self.queue.get(timeout=WARM_AFTER_S)
        except queue.Empty:
            import urllib.request  # noqa: F401 - ~20 ms, off the end's path

            payload = self.queue.get()
        while True:
            if payload is None:
                return
            try:
                self.deliver(payload)
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the thread
                self.record("notify_failed", payload, error=f"{type(exc).__name__}: {exc}")
            with self.lock:
                self.pending.remove(str(payload["event"]))
            payload = self.queue.get()

    def deliver(self, payload: dict[str, Any]) -> None:
        url = secrets.resolve(str(self.hook["url"]), self.names, os.environ)
        if not url.startswith(("http://", "https://")):
            self.record("notify_failed", payload, error="the URL is not http(s) once resolved")
            return
        data = body(url, payload)
        headers = {"Content-Type": "application/json", "User-Agent": "treb-notify"}
        name = self.hook.get("secret")
        if name:
            key = os.environ.get(str(name))
            if not key:
                self.record("notify_failed", payload,
                            error=f"{name} is not set where the run is supervised: not sent "
                            "unsigned")  # fmt: skip
                return
            headers[SIGNATURE] = signature(key.encode(), data)
        error, tries, wait = "", 0, BACKOFF_S
        while tries < TRIES:
            tries += 1
            status, error, after = post(url, data, headers, min(TIMEOUT_S, self.left()))
            if status is not None and status < 300:
                self.record("notify_sent", payload, status=status, tries=tries)
                return
            if status is not None and status < 500 and status != 429:
                break  # the receiver refused it: sending it again changes nothing
            pause = min(after, RETRY_AFTER_CAP_S) if after is not None else wait
            wait *= 2
            if tries >= TRIES or pause >= self.left():
                break
            time.sleep(pause)
        self.record("notify_failed", payload, error=error, tries=tries)

    def record(self, kind: str, payload: dict[str, Any], **fields: Any) -> None:
        with contextlib.suppress(OSError):
            append_event(self.run_dir, kind, notify=payload["event"],
                         url=where(str(self.hook["url"])), **fields)  # fmt: skip


def post(
    url: str, data: bytes, headers: dict[str, str], timeout: float
) -> tuple[int | None, str, float | None]:
    """One POST: (HTTP status or None, error, Retry-After seconds or None)."""
    import urllib.error
    import urllib.request

    if timeout <= 0:
        return None, "no time left before the run's end", None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only
            return int(resp.status), "", None
    except urllib.error.HTTPError as exc:
        return int(exc.code), f"HTTP {exc.code}", retry_after(exc.headers.get("Retry-After"))
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, bad URL
        reason = getattr(exc, "reason", exc)
        return None, f"{type(exc).__name__}: {reason}"[:300], None


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form; an HTTP date counts as the cap)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return RETRY_AFTER_CAP_S


class LogWatch(threading.Thread):
    """One attempt's `log:` patterns, searched in its logs every LOG_STEP_S by a matcher
    child; each pattern notifies at most once an attempt."""

    def __init__(self, notifier: Notifier, adir: str, attempt: int) -> None:
        super().__init__(name="treb-notify-logs", daemon=True)
        self.notifier, self.adir, self.attempt = notifier, adir, attempt
        self.stopped = threading.Event()
        self.offsets: dict[str, int] = {}
        self.left = sorted({p for h in notifier.hooks for p in patterns(h)})
        self.matcher = LogMatcher()

    def run(self) -> None:
        try:
            while self.left and not self.stopped.wait(LOG_STEP_S):
                self.look()
            if self.left:
                self.look()  # what the ranks printed last
        finally:
            self.matcher.close()

    def look(self) -> None:
        try:
            names = sorted(n for n in os.listdir(self.adir) if n.endswith(".log"))
        except OSError:
            return
        files = [(os.path.join(self.adir, n), self.offsets.get(n, 0)) for n in names]
        request = json.dumps({"patterns": self.left, "files": files})
        try:
            answer = self.matcher.search(request, policies.MATCH_TIMEOUT_S)
            found, offsets = answer["found"], answer["offsets"]
        except (TimeoutError, OSError, ValueError, KeyError, TypeError):
            offsets, found = [size_of(p) for p, _ in files], []  # what hung is skipped
        for name, offset in zip(names, offsets):
            self.offsets[name] = int(offset)
        for index, line in found:
            pattern = self.left[index]
            self.notifier.log_matched(self.attempt, pattern, line)
        hit = {self.left[i] for i, _ in found}
        self.left = [p for p in self.left if p not in hit]


def size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class LogMatcher(policies.Matcher):
    """The log policies' matcher child, answering LogWatch's requests (`_serve_logs`)."""

    SERVE = (__name__, "_serve_logs")


def _serve_logs() -> None:
    """The child's side: {"patterns", "files": [[path, offset]]} a line on stdin, answered
    with {"found": [[pattern index, line]], "offsets": [...]} (whole lines only)."""
    import sys

    for raw in sys.stdin:
        try:
            request = json.loads(raw)
            found, offsets = _search_new(request["patterns"], request["files"])
            answer: dict[str, Any] = {"found": found, "offsets": offsets}
        except Exception:  # noqa: BLE001 - a bad request finds nothing, the child lives on
            answer = {"found": [], "offsets": []}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def _search_new(pats: list[str], files: list[list[Any]]) -> tuple[list[Any], list[int]]:
    from .regular import open_regular

    compiled = [re.compile(p, re.M) for p in pats]
    found: dict[int, str] = {}
    offsets = []
    for path, offset in files:
        offset = int(offset)
        try:
            with open_regular(path) as fh:
                fh.seek(0, 2)
                size = fh.tell()
                offset = max(offset, size - SCAN_BYTES) if size >= offset else 0
                fh.seek(offset)
                data = fh.read(SCAN_BYTES)
        except OSError:
            offsets.append(offset)
            continue
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) < SCAN_BYTES:
            offsets.append(offset)  # no whole line yet
            continue
        chunk = data[: end or len(data)]
        offsets.append(offset + len(chunk))
        text = chunk.decode(errors="replace")
        for i, rx in enumerate(compiled):
            m = None if i in found else rx.search(text)
            if m:
                start = text.rfind("\n", 0, m.start()) + 1
                stop = text.find("\n", m.end())
                found[i] = text[start : stop if stop >= 0 else len(text)].strip()[:300]
    return [[i, line] for i, line in sorted(found.items())], offsets


class Notifier:
    """What the job controller calls: `event` for a run's start, end and hang, `attempt`
    around each attempt (the log patterns' watch), `close` at the run's end."""

    def __init__(self, run_dir: str, spec: dict[str, Any]) -> None:
        """`spec`: the run's spec.json; the run id is its directory's name, as every engine
        lays runs out."""
        self.run_dir, self.run_id = run_dir, os.path.basename(run_dir)
        self.hooks = hooks_of(spec)
        self.name = str(spec.get("name") or self.run_id)
        names = [str(n) for n in spec.get("secrets") or []]
        self.senders = [Sender(run_dir, h, names) for h in self.hooks]
        self.watch: LogWatch | None = None
        self.closed = False
        self.ended: list[LogWatch] = []  # stopped watches, maybe in their last look

    def payload(self, event: str, state: str, cause: str = "", **extra: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "name": self.name, "event": event, "state": state,
                "cause": cause, "link": link(self.run_dir, self.run_id), "time": time.time(),
                **extra}  # fmt: skip

    def event(self, event: str, state: str, cause: str = "", **extra: Any) -> None:
        """`event` (one of EVENTS) to the webhooks that asked for it; never blocks."""
        payload = None
        for sender in self.senders:
            if wanted(sender.hook, event):
                payload = payload or self.payload(event, state, cause, **extra)
                sender.put(payload)

    def log_matched(self, attempt: int, pattern: str, line: str) -> None:
        payload = self.payload("log", "RUNNING", f"log pattern {pattern!r} matched",
                               attempt=attempt, pattern=pattern, line=line)  # fmt: skip
        for sender in self.senders:
            if pattern in patterns(sender.hook):
                sender.put(payload)

    def attempt(self, attempt: int, adir: str) -> None:
        """The attempt started: its logs are watched for the `log:` patterns; the
        senders start (idle, they make ready for the end)."""
        self.end_attempt()
        for sender in self.senders:
            sender.begin()
        if any(patterns(h) for h in self.hooks):
            self.watch = LogWatch(self, adir, attempt)
            self.watch.start()

    def pids(self) -> list[int]:
        """The log watches' matcher children: the supervisor's own helpers, not strays."""
        watches = [*self.ended, *([self.watch] if self.watch is not None else [])]
        return [w.matcher.pid for w in watches if w.matcher.pid is not None]

    def end_attempt(self) -> None:
        """The attempt's processes ended: one last look at its logs, waited for at most
        LAST_LOOK_S (before the supervisor ends what the attempt left: its child would
        be one), then no more."""
        if self.watch is not None:
            self.watch.stopped.set()
            self.watch.join(LAST_LOOK_S)
            if self.watch.is_alive():
                self.ended.append(self.watch)
            self.watch = None

    def close(self, wait: float = END_WAIT_S) -> None:
        """The run's end: at most `wait` seconds for the queued sends; what is left then
        is recorded as given up. Once."""
        if self.closed:
            return
        self.closed = True
        self.end_attempt()
        deadline = time.monotonic() + wait
        for watch in self.ended:  # their last matches are queued before the senders stop
            watch.join(max(0.0, deadline - time.monotonic()))
        for sender in self.senders:
            sender.deadline = deadline
            if sender.ident is not None:
                sender.queue.put(None)
        for sender in self.senders:
            if sender.ident is not None:
                sender.join(max(0.0, deadline - time.monotonic()))
            with sender.lock:
                left = list(sender.pending)
            for event in left:
                sender.record("notify_failed", {"event": event},
                              error=f"not sent within {wait:g} s of the run's end")  # fmt: skip
