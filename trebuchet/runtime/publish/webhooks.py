"""The spec's `notify:` webhooks (docs/notify.md), sent by the job controller wherever it
runs (locally, beside ssh hosts, in a Slurm batch step): hence stdlib urllib only.

Never delaying supervision: each webhook's daemon thread sends its events in order; a
request's TIMEOUT_S bounds all of it (lookup, connect, TLS, send, the answer's head) through
sockets that wait in slices (_Deadline), so a receiver trickling bytes holds nothing past it
and the run's end can move it earlier. Each event gets exactly one outcome in events.jsonl.
Receivers are not trusted: no redirect is followed (the signature goes to the configured
URL only), no body read, and a URL is only named as where() shows it (its path may be a
credential). The HMAC key and a `${NAME}` URL are read from the controller's environment
(inherited on every engine), never written. Log patterns are searched by a killable child
(policies.Matcher): a pattern that backtracks costs a child, never the controller's time.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import math
import os
import queue
import re
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, NamedTuple

from ..contracts import secrets
from ..contracts.schema import NOTIFY_EVENTS
from ..rundir.records import append_event, left_first_how
from ..watch import log_policies as policies

if TYPE_CHECKING:
    from ..contracts.schema import FirstFailure

EVENTS = NOTIFY_EVENTS
TIMEOUT_S = 5.0  # one request, all of it: the lookup, connect, send and the answer's head
LATE = "no answer in time"  # post()'s error when the request's deadline passed
TIMEOUTS = (socket.timeout, TimeoutError)  # one class since Python 3.10, two before
SLICE_S = 0.2  # a request's waits look at its deadline (which the run's end moves) this often
TRIES = 3  # a send's requests at most (the first and two retries)
BACKOFF_S = 0.5  # doubled after each failed try
RETRY_AFTER_CAP_S = 10.0  # a Retry-After longer than this is cut to it
END_WAIT_S = 5.0  # the run's end waits at most this long for queued sends
WARM_AFTER_S = 1.0  # a sender idle this long imports urllib, ready for the run's end
LOG_STEP_S = 2.0  # how often the logs are searched for the `log:` patterns
LAST_LOOK_S = 1.0  # the attempt's end waits at most this long for the last look
SIGNATURE = "X-Treb-Signature"
SLACK_HOSTS = ("hooks.slack.com",)
SECRET_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")  # a URL that is itself a secret

Hook = Dict[str, Any]  # one item of the spec's notify: {url, on, secret}


def hooks_of(spec: dict[str, Any]) -> list[Hook]:
    return [h for h in spec.get("notify") or [] if isinstance(h, dict) and h.get("url")]


def signature(key: bytes, body: bytes) -> str:
    import hashlib
    import hmac

    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


# The only URLs sent to (no user info); spec/notify.py and launcher/submit.py refuse others.
URL = re.compile(r"(https?)://([A-Za-z0-9.-]+)(?::([0-9]{1,5}))?(/[\x21-\x7e]*)?", re.I)


def url_problem(url: str) -> str | None:
    """Why treb does not send to `url`, or None; never quoting it (it may be a credential)."""
    m = URL.fullmatch(url)
    if not m:
        return "not an http:// or https:// URL (host: letters, digits, dots, dashes; no user info)"
    if m.group(3) and not 0 < int(m.group(3)) < 65536:
        return "the port is not between 1 and 65535"
    return None


def unsendable(url: str, environ: Mapping[str, str]) -> str | None:
    """At submission, why the URL a `${NAME}` secret holds is not one treb sends to, naming
    NAME, never its value (a plain URL was checked by the spec's model)."""
    if not SECRET_REF.fullmatch(url):
        return None
    name = url[2:-1]
    value = environ.get(name)
    if value is None:
        return f"{name} is not set in this shell"
    if not value:
        return f"{name} is empty"
    why = url_problem(value)
    return f"{name} does not hold a URL treb sends to: {why}" if why else None


def where(url: str) -> str:
    """`scheme://host[:port]/…`: how events name a URL (a hook's path may be its credential)."""
    m = URL.fullmatch(url)
    if not m or url_problem(url):
        return "?"
    port = f":{int(m.group(3))}" if m.group(3) else ""
    rest = "/…" if m.group(4) not in (None, "/") else ""
    return f"{m.group(1).lower()}://{m.group(2).lower()}{port}{rest}"


def shown(written: str, resolved: str) -> str:
    """where() of the URL sent, or the `${NAME}` written when NAME holds no URL (not its value)."""
    out = where(resolved)
    if out == "?" and SECRET_REF.fullmatch(written):
        return written
    return out


def scrub(text: str, url: str) -> str:
    """An error's text without the URL's parts: they may be a credential."""
    m = URL.fullmatch(url)
    rest = (m.group(4) or "") if m else url
    pieces = {url, rest, *re.split(r"[/?#&=;:@]", rest)}
    for piece in sorted(pieces, key=len, reverse=True):
        if len(piece) >= 4:
            text = text.replace(piece, "…")
    return text


def is_slack(url: str) -> bool:
    m = URL.fullmatch(url)
    return m is not None and m.group(2).lower() in SLACK_HOSTS


def wanted(hook: Hook, event: str) -> bool:
    return any(o == event for o in hook.get("on") or [] if isinstance(o, str))


def patterns(hook: Hook) -> list[str]:
    return [o["log"] for o in hook.get("on") or [] if isinstance(o, dict) and "log" in o]


def link(run_dir: str, run_id: str) -> str:
    base = os.environ.get("TREB_DASHBOARD_URL", "").rstrip("/")
    return f"{base}/runs/{run_id}" if base.startswith(("http://", "https://")) else run_dir


def cause_text(cause: FirstFailure | None) -> str:
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
    if cause.get("left_first"):  # its SIGTERM is the launcher's (records.left_first)
        how = left_first_how(cause)
    host = f" on {cause['host']}" if cause.get("host") else ""
    return f"{who} {how}{host}"


def body(hook_url: str, payload: dict[str, Any]) -> bytes:
    if is_slack(hook_url):
        words = f"treb: run {payload['name']} ({payload['run_id']}) {payload['event']}"
        if payload.get("cause"):
            words += f": {payload['cause']}"
        if payload.get("line"):
            words += f"\n> {payload['line']}"
        payload = {"text": f"{words}\n{payload['link']}"}
    return json.dumps(payload, sort_keys=True).encode()


class Item:
    """One event queued for one webhook; `done` once its one outcome is recorded."""

    __slots__ = ("payload", "done", "cut")

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.done = False
        self.cut: float | None = None  # monotonic: the run's end moves the queue on


class Sender(threading.Thread):
    def __init__(self, run_dir: str, hook: Hook, names: list[str]) -> None:
        super().__init__(name="treb-notify", daemon=True)
        self.run_dir, self.hook, self.names = run_dir, hook, names
        self.queue: queue.Queue[Item | None] = queue.Queue()
        self.lock = threading.Lock()
        self.pending: list[Item] = []  # queued or in flight, in order
        self.deadline: float | None = None  # monotonic: set by the run's end

    def put(self, payload: dict[str, Any]) -> None:
        item = Item(payload)
        with self.lock:
            self.pending.append(item)
        self.begin()
        self.queue.put(item)

    def begin(self) -> None:
        if self.ident is None:
            self.start()

    def until(self, item: Item, started: float) -> float:
        ends = [started + TIMEOUT_S, self.deadline, item.cut]
        return min(t for t in ends if t is not None)

    def run(self) -> None:
        try:  # idle a while (the launch's burst): urllib is imported before the run's end
            item = self.queue.get(timeout=WARM_AFTER_S)
        except queue.Empty:
            import urllib.request  # noqa: F401 - ~20 ms, off the end's path

            item = self.queue.get()
        while item is not None:
            try:
                self.deliver(item)
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the thread
                self.record("notify_failed", item, error=f"{type(exc).__name__}")
            with self.lock:
                self.pending.remove(item)
            item = self.queue.get()

    def deliver(self, item: Item) -> None:
        url = secrets.resolve(str(self.hook["url"]), self.names, os.environ)
        why = url_problem(url)
        if why:
            self.record("notify_failed", item, error=f"the URL is {why}")
            return
        data = body(url, item.payload)
        headers = {"Content-Type": "application/json", "User-Agent": "treb-notify"}
        name = self.hook.get("secret")
        if name:
            key = os.environ.get(str(name))
            if not key:
                self.record("notify_failed", item,
                            error=f"{name} is not set where the run is supervised: not sent "
                            "unsigned")  # fmt: skip
                return
            headers[SIGNATURE] = signature(key.encode(), data)
        error, tries, wait = "", 0, BACKOFF_S
        while tries < TRIES:
            tries += 1
            asked = time.monotonic()
            answer = post(url, data, headers, functools.partial(self.until, item, asked))
            status, error = answer.status, answer.error
            if error == LATE:
                error = f"no answer within {round(time.monotonic() - asked, 1):g} s"
            if status is not None and 200 <= status < 300:
                self.record("notify_sent", item, status=status, tries=tries)
                return
            if not answer.retry:
                break  # refused, redirected, or no answer in time: again changes nothing
            pause = min(answer.after, RETRY_AFTER_CAP_S) if answer.after is not None else wait
            wait *= 2
            if tries >= TRIES or time.monotonic() + pause >= self.until(item, math.inf):
                break
            time.sleep(pause)
        self.record("notify_failed", item, error=scrub(error, url), tries=tries)

    def shown(self) -> str:
        written = str(self.hook["url"])
        return shown(written, secrets.resolve(written, self.names, os.environ))

    def settle(self, item: Item) -> bool:
        with self.lock:
            first, item.done = not item.done, True
        return first

    def record(self, kind: str, item: Item, **fields: Any) -> None:
        """A second outcome (a send that ended after the run's end gave it up) is dropped."""
        if not self.settle(item):
            return
        fields["url"] = self.shown()
        with contextlib.suppress(OSError):
            append_event(self.run_dir, kind, notify=item.payload["event"], **fields)

    def give_up(self, wait: float) -> None:
        with self.lock:
            left = [i for i in self.pending if not i.done]
        for item in left:
            self.record("notify_failed", item, error=f"not sent within {wait:g} s of the run's end")

    def share(self, at: float) -> None:
        """The run's end: the events before the last (the end's) are over by `at`, so that a
        hanging earlier send still leaves the last one its time."""
        with self.lock:
            for item in self.pending[:-1]:
                item.cut = at


class Answer(NamedTuple):
    status: int | None  # None: no answer
    error: str = ""
    after: float | None = None  # Retry-After, seconds
    retry: bool = False  # whether trying again may help


def post(url: str, data: bytes, headers: dict[str, str], until: Callable[[], float]) -> Answer:
    import http.client
    import urllib.error
    import urllib.request

    started = time.monotonic()
    if until() <= started:
        return Answer(None, "no time left before the run's end")
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with _opener(url, until).open(req, timeout=until() - started) as resp:
            status = int(resp.status)
            after = retry_after(resp.headers.get("Retry-After"))
    except (OSError, ValueError, http.client.HTTPException) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        kind = type(reason).__name__
        if isinstance(reason, TIMEOUTS):
            return Answer(None, LATE)
        if isinstance(reason, OSError):  # refused, reset, unreachable, no such host
            return Answer(None, f"{kind}: {reason}"[:300], retry=True)
        if isinstance(reason, ValueError):
            return Answer(None, f"{kind}: the URL is not valid (not shown: it may hold a key)")
        return Answer(None, f"{kind}: the answer is not HTTP")
    if 200 <= status < 300:
        return Answer(status)
    if 300 <= status < 400:  # the body and its signature go to the URL configured only
        return Answer(status, f"HTTP {status} redirect not followed")
    return Answer(status, f"HTTP {status}", after, retry=status >= 500 or status == 429)


def _opener(url: str, until: Callable[[], float]) -> Any:
    """urllib's opener without the redirect and error handlers, its sockets bound to `until`."""
    import http.client
    import urllib.request

    def made(kind: type[http.client.HTTPConnection]) -> Callable[..., Any]:
        def make(host: str, **kw: Any) -> http.client.HTTPConnection:
            conn = kind(host, **kw)
            conn._create_connection = functools.partial(_connect, until=until)  # type: ignore[attr-defined]
            return conn

        return make

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(made(http.client.HTTPConnection), req)

    opener = urllib.request.OpenerDirector()
    opener.add_handler(urllib.request.ProxyHandler())
    opener.add_handler(Plain())
    if url[:6].lower() == "https:":
        import ssl

        context = ssl.create_default_context()
        context.sslsocket_class = type(  # its handshake, sends and reads armed as well
            "DeadlineSSLSocket", (_Deadline, ssl.SSLSocket), {"until": staticmethod(until)}
        )

        class Secure(urllib.request.HTTPSHandler):
            def https_open(self, req: Any) -> Any:
                return self.do_open(made(http.client.HTTPSConnection), req, context=context)

        opener.add_handler(Secure(context=context))
    return opener


class _Deadline:
    """Reads and the TLS handshake wait in slices of SLICE_S, checking `until()` between
    them: no per-read timeout ends a receiver that trickles a byte at a time, and a deadline
    moved earlier (the run's end) is seen at once."""

    until: Callable[[], float]

    def arm(self, most: float = math.inf) -> None:
        left = self.until() - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's time is up")
        self.settimeout(min(left, most))  # type: ignore[attr-defined]

    def sliced(self, step: Callable[[], Any]) -> Any:
        while True:
            self.arm(SLICE_S)
            try:
                return step()
            except TIMEOUTS:
                continue

    def recv(self, *args: Any) -> Any:
        return self.sliced(lambda: super(_Deadline, self).recv(*args))  # type: ignore[misc]

    def recv_into(self, *args: Any) -> Any:
        return self.sliced(lambda: super(_Deadline, self).recv_into(*args))  # type: ignore[misc]

    def do_handshake(self, *args: Any) -> Any:
        return self.sliced(lambda: super(_Deadline, self).do_handshake(*args))  # type: ignore[misc]

    def send(self, *args: Any) -> Any:  # a send cut short may have sent a part: not sliced
        self.arm()
        return super().send(*args)  # type: ignore[misc]

    def sendall(self, *args: Any) -> Any:
        self.arm()
        return super().sendall(*args)  # type: ignore[misc]

    def connect(self, addr: Any) -> None:
        self.arm()
        self.setblocking(False)  # type: ignore[attr-defined]
        err = self.connect_ex(addr)  # type: ignore[attr-defined]
        while err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY):
            left = self.until() - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's time is up")
            if select.select([], [self.fileno()], [], min(left, SLICE_S))[1]:  # type: ignore[attr-defined]
                err = self.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # type: ignore[attr-defined]
        if err:
            raise OSError(err, os.strerror(err))
        self.arm()


class _DeadlineSocket(_Deadline, socket.socket):
    pass


def _connect(address: tuple[str, int], timeout: object = None, source: object = None, *,
             until: Callable[[], float]) -> socket.socket:  # fmt: skip
    """socket.create_connection with a deadline (getaddrinfo cannot be interrupted: _lookup)."""
    host, port = address
    error: OSError = OSError("no address for the host")
    for family, kind, proto, _, addr in _lookup(host, port, until):
        sock = _DeadlineSocket(family, kind, proto)
        sock.until = until
        try:
            sock.connect(addr)
            return sock
        except OSError as exc:
            sock.close()
            if isinstance(exc, TIMEOUTS):
                raise
            error = exc
    raise error


def _lookup(host: str, port: int, until: Callable[[], float]) -> list[Any]:
    with contextlib.suppress(OSError):  # an address: no lookup
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    box: list[Any] = []

    def look() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except OSError as exc:
            box.append(exc)

    helper = threading.Thread(target=look, name="treb-notify-lookup", daemon=True)
    helper.start()
    while helper.is_alive() and time.monotonic() < until():
        helper.join(min(SLICE_S, max(0.0, until() - time.monotonic())))
    if not box:
        raise TimeoutError("the host's name was not looked up in time")
    if isinstance(box[0], OSError):
        raise box[0]
    return list(box[0])


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delta form; an HTTP date counts as the cap)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return RETRY_AFTER_CAP_S


class LogWatch(threading.Thread):
    """One attempt's `log:` patterns; each notifies at most once an attempt."""

    def __init__(self, notifier: Notifier, adir: str, attempt: int) -> None:
        super().__init__(name="treb-notify-logs", daemon=True)
        self.notifier, self.adir, self.attempt = notifier, adir, attempt
        self.stopped = threading.Event()
        self.offsets: dict[str, int] = {}
        self.left = sorted({p for h in notifier.hooks for p in patterns(h)})
        self.matcher = policies.Matcher()

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


class Notifier:
    """What the job controller calls; the run id is its directory's name on every engine."""

    def __init__(self, run_dir: str, spec: dict[str, Any]) -> None:
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
        """The senders start now: idle, they import urllib before the run's end needs it."""
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
        """One last look at the logs, waited for at most LAST_LOOK_S (the supervisor then
        ends what the attempt left, the matcher child among it)."""
        if self.watch is not None:
            self.watch.stopped.set()
            self.watch.join(LAST_LOOK_S)
            if self.watch.is_alive():
                self.ended.append(self.watch)
            self.watch = None

    def close(self, wait: float = END_WAIT_S) -> None:
        if self.closed:
            return
        self.closed = True
        self.end_attempt()
        deadline = time.monotonic() + wait
        for watch in self.ended:  # their last matches are queued before the senders stop
            watch.join(max(0.0, deadline - time.monotonic()))
        for sender in self.senders:
            sender.deadline = deadline
            sender.share(time.monotonic() + wait / 2)
            if sender.ident is not None:
                sender.queue.put(None)
        for sender in self.senders:
            if sender.ident is not None:
                sender.join(max(0.0, deadline - time.monotonic()))
            sender.give_up(wait)
