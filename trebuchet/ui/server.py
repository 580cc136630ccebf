"""Serving the dashboard: bind (127.0.0.1 unless told otherwise), print the URL with its
token, run uvicorn until Ctrl+C."""

from __future__ import annotations

import socket
import sys

from trebuchet.errors import UserError
from trebuchet.runtime.process.procs import hostname


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"treb ui: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(host: str, port: int, token: str) -> None:
    import uvicorn

    from trebuchet.ui.app import create_app

    sock = bind(host, port)
    port = sock.getsockname()[1]
    shown = hostname() if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    print(f"treb ui: http://{shown}:{port}/?token={token}", flush=True)
    print("treb ui: the token is needed for every request; Ctrl+C stops the server",
          file=sys.stderr, flush=True)  # fmt: skip
    app = create_app(token, cookie=f"treb_ui_{port}")
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
