"""Slow HTTP servers for the trackers' tests: real sockets, real waits.

`SlowProxy` sits in front of a real server (the MLflow server of
tests/integration/test_tracking.py) and answers as it is told at the moment a request
arrives: `pass` (as the server answers), `delay` (the server's answer after `delay_s`: the
server did the work), `trickle` (one byte of an answer every `trickle_s`: a socket
timeout never fires) or `hang` (nothing, until the test ends); the last two do not pass
the request on (it did not get through). `Canned` is a stand-in that needs no server: it
answers MLflow's endpoints with fixed JSON (and records what it was asked), with the
same modes. `Hook` is a webhook receiver: each POST recorded with its headers, answered
as told per path (a status, headers such as a redirect's Location, a mode). All stop their
threads at close().
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time


class _Server:
    """A threaded TCP server; each connection is handled by `serve(conn)`."""

    def __init__(self) -> None:
        self.mode = "pass"
        self.delay_s = 2.0
        self.trickle_s = 0.2
        self.requests: list[tuple[str, str, bytes]] = []  # (method, path, body) as received
        self.connections = 0
        self.closed = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            self.serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def serve(self, conn: socket.socket) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def read_request(self, conn: socket.socket) -> bytes:
        """One whole HTTP request (headers and Content-Length body)."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        method, path = head.split(b" ")[:2]
        self.requests.append((method.decode(), path.decode(), body))
        return head + b"\r\n\r\n" + body

    def answer(self, conn: socket.socket, response: bytes, mode: str | None = None) -> None:
        """Send `response` as `mode` (default: the current mode) says."""
        mode = mode or self.mode
        if mode == "hang":
            self.closed.wait()
            return
        if mode == "delay" and self.closed.wait(self.delay_s):
            return
        if mode == "trickle":
            for i in range(len(response)):  # one byte at a time, never a whole answer
                if self.closed.wait(self.trickle_s):
                    return
                conn.sendall(response[i : i + 1])
            return
        conn.sendall(response)

    def paths(self) -> list[str]:
        return [path.split("?")[0] for _, path, _ in self.requests]

    def close(self) -> None:
        self.closed.set()
        self._thread.join(timeout=5)
        self.sock.close()


class SlowProxy(_Server):
    """In front of `upstream` (http://host:port): each request forwarded as received, the
    answer sent back as the mode says."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.split("://", 1)[1].rstrip("/").partition(":")
        self.upstream = (host, int(port))
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        request = self.read_request(conn)
        if not request:
            return
        if self.mode in ("trickle", "hang"):  # the server never sees it
            self.answer(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # fmt: skip
            return
        head, _, body = request.partition(b"\r\n\r\n")
        lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
        request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(request)
            response = b""
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    break
                response += chunk
        self.answer(conn, response)


RUN_ID = "0123456789abcdef0123456789abcdef"


class Canned(_Server):
    """MLflow's endpoints with fixed answers: experiment "1", run RUN_ID (artifacts proxied),
    `{}` for everything else."""

    def serve(self, conn: socket.socket) -> None:
        request = self.read_request(conn)
        if not request:
            return
        path = self.requests[-1][1]
        if "experiments/get-by-name" in path:
            body: dict = {"experiment": {"experiment_id": "1"}}
        elif "runs/create" in path:
            body = {"run": {"info": {"run_id": RUN_ID,
                                     "artifact_uri": f"mlflow-artifacts:/1/{RUN_ID}/artifacts"}}}  # fmt: skip
        else:
            body = {}
        data = json.dumps(body).encode()
        response = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(data)).encode() + b"\r\n"
                    b"Connection: close\r\n\r\n" + data)  # fmt: skip
        self.answer(conn, response)

    def bodies(self, endpoint: str) -> list[dict]:
        return [json.loads(b or b"{}") for _, p, b in self.requests if endpoint in p]


class Hook(_Server):
    """A webhook receiver. Every request is kept in `posts` ({method, path, body, headers},
    header names in lower case); `answers[path]` holds the answers to give first, in order,
    each (status, extra headers, mode), then 200 in the "pass" mode. A `body_bytes` answer
    header announces that many body bytes and sends none (a 4 GB answer). With `tls` (a
    server context), it speaks HTTPS."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.posts: list[dict] = []
        self.answers: dict[str, list[tuple[int, dict[str, str], str]]] = {}
        self.tls = tls
        if tls is not None:
            self.uri = f"https://127.0.0.1:{self.port}"

    def serve(self, conn: socket.socket) -> None:
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True)
        request = self.read_request(conn)
        if not request:
            return
        head, _, body = request.partition(b"\r\n\r\n")
        method, path = head.split(b"\r\n")[0].decode().split(" ")[:2]
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        with self.lock:
            self.posts.append({"method": method, "path": path, "body": body, "headers": headers})
            todo = self.answers.get(path) or []
            status, extra, mode = todo.pop(0) if todo else (200, {}, "pass")
        extra = dict(extra)
        length = extra.pop("body_bytes", "0")
        lines = [f"HTTP/1.1 {status} Answer", *(f"{k}: {v}" for k, v in extra.items()),
                 f"Content-Length: {length}", "Connection: close", "", ""]  # fmt: skip
        self.answer(conn, "\r\n".join(lines).encode(), mode)
        if length != "0":
            self.closed.wait()  # the body never comes

    def got(self, path: str | None = None) -> list[dict]:
        """The POSTs' JSON bodies (at `path`)."""
        with self.lock:
            return [json.loads(p["body"]) for p in self.posts
                    if p["method"] == "POST" and path in (None, p["path"])]  # fmt: skip


def wait_until(check, timeout: float = 30.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"timed out waiting for {what or check}"
        time.sleep(0.05)
