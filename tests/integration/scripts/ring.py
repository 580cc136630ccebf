"""A token passed once around all ranks over TCP, rank r -> r+1 -> ... -> 0 (stdlib only).

Test and benchmark helper for multi-node runs: it proves that every rank started with the
rank contract (RANK, WORLD_SIZE) and can reach the next rank's node over the network.
Each rank listens on a free port of its own node and publishes `host port` in a shared
folder (argv[1], default $TREB_RUN_DIR/ring-$TREB_ATTEMPT: the filesystem is shared
between the nodes); the host is the node's hostname, so the connection crosses nodes.
Rank 0 starts the token and checks that it comes back with every rank in order.
Each rank prints one line (its log says the token went through it); exit 0 when it did.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

TIMEOUT = 120.0  # seconds a rank waits for its neighbours before giving up


def publish(folder: str, rank: int, host: str, port: int) -> None:
    tmp = os.path.join(folder, f".addr-{rank}.tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{host} {port}\n")
    os.replace(tmp, os.path.join(folder, f"addr-{rank}"))  # readers never see half a line


def lookup(folder: str, rank: int, deadline: float) -> tuple[str, int]:
    path = os.path.join(folder, f"addr-{rank}")
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"ring: rank {rank} never published its address in {folder}")
        time.sleep(0.02)
    with open(path) as fh:
        host, port = fh.read().split()
    return host, int(port)


def receive(server: socket.socket) -> list:
    conn, _ = server.accept()
    with conn, conn.makefile("rb") as fh:
        return json.loads(fh.readline())


def send(addr: tuple[str, int], token: list) -> None:
    with socket.create_connection(addr, timeout=TIMEOUT) as conn:
        conn.sendall(json.dumps(token).encode() + b"\n")


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    default = os.path.join(os.environ.get("TREB_RUN_DIR", "."),
                           f"ring-{os.environ.get('TREB_ATTEMPT', '0')}")  # fmt: skip
    folder = sys.argv[1] if len(sys.argv) > 1 else default
    os.makedirs(folder, exist_ok=True)
    host = socket.gethostname()
    deadline = time.monotonic() + TIMEOUT
    server = socket.create_server(("", 0))
    server.settimeout(TIMEOUT)
    publish(folder, rank, host, server.getsockname()[1])
    nxt = (rank + 1) % world
    with server:
        if rank == 0:
            send(lookup(folder, nxt, deadline), [[0, host]])
            token = receive(server)
            ranks = [r for r, _ in token]
            if ranks != list(range(world)):
                sys.exit(f"ring: token came back with ranks {ranks}, expected 0..{world - 1}")
            hosts = len({h for _, h in token})
            print(f"rank 0 on {host}: token went around {world} ranks on {hosts} hosts")
        else:
            token = receive(server)
            prev = token[-1][0]
            send(lookup(folder, nxt, deadline), [*token, [rank, host]])
            print(f"rank {rank} on {host}: token from rank {prev} passed to rank {nxt}")


if __name__ == "__main__":
    main()
