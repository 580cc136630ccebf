"""A program with its own rendezvous on MASTER_PORT, as users write them (issue 35): rank 0
listens on MASTER_PORT and accepts WORLD_SIZE-1 connections, reading one JSON line from
each; the other ranks connect (with retries: rank 0 may not listen yet) and send one JSON
line. Any other connection to rank 0's port (a launcher's probe, a health check) is a
failure: its empty or foreign line does not parse, or names no rank that is still due.
Exit 0 with `rendezvous ok` on rank 0 when every rank said hello exactly once."""

from __future__ import annotations

import json
import os
import socket
import sys
import time

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ADDR, PORT = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def serve() -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("", PORT))
    srv.listen(WORLD)
    srv.settimeout(120)
    due = set(range(1, WORLD))
    while due:
        conn, peer = srv.accept()
        with conn:
            conn.settimeout(30)
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        hello = json.loads(data)  # an empty probe: JSONDecodeError, as users' code fails
        rank = hello.get("rank") if isinstance(hello, dict) else None
        if rank not in due:
            print(f"unexpected connection from {peer}: {data!r}", file=sys.stderr)
            return 3
        due.discard(rank)
    print("rendezvous ok", flush=True)
    return 0


def join() -> int:
    end = time.monotonic() + 120
    while True:
        try:
            sock = socket.create_connection((ADDR, PORT), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)
    with sock:
        sock.sendall(json.dumps({"rank": RANK, "host": socket.gethostname()}).encode() + b"\n")
    print("joined", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve() if RANK == 0 else join())
