"""Check trebuchet's per-rank environment contract, then say hello to rank 0 over TCP.

Why: a launcher bug (a wrong RANK, an unreachable MASTER_ADDR, a missing TREB_* variable)
should fail loudly in seconds with a precise message, before any real job burns GPU hours.
Stdlib only, so it runs in any Python environment.

- launcher native: every rank checks RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  NODE_RANK == GROUP_RANK, NUM_NODES, their consistency, MASTER_*, TREB_*,
  PYTHONUNBUFFERED=1 and OMP_NUM_THREADS >= 1.
- launcher none (RANK unset, NODE_RANK set: one process per node): checks NODE_RANK,
  NUM_NODES, MASTER_*, LOCAL_WORLD_SIZE and TREB_*; the node is the rank.
- launcher torchrun (TORCHELASTIC_RUN_ID set): the rank variables torchrun sets, MASTER_*
  and TREB_*; torchrun's own store holds MASTER_PORT, so the hellos use MASTER_PORT+1.

Then rank 0 listens on MASTER_PORT, the others send `hello from rank R` and get `welcome R`.
A failed check prints `CONTRACT FAIL: <var>: <why>` to stderr and exits 3.
"""

from __future__ import annotations

import os
import socket
import sys
import time

CONNECT_WINDOW_S = 30.0  # how long a rank keeps retrying while rank 0 is not listening yet
ACCEPT_WINDOW_S = 60.0  # how long rank 0 waits for all the others
IO_TIMEOUT_S = 10.0

failures: list[str] = []


def fail(var: str, why: str) -> None:
    """Record a contract violation; all of them are reported before exiting."""
    failures.append(var)
    print(f"CONTRACT FAIL: {var}: {why}", file=sys.stderr, flush=True)


def need_int(var: str, minimum: int = 0) -> int | None:
    """The variable as an int >= minimum, or None (after recording why) when it is not."""
    raw = os.environ.get(var)
    if raw is None:
        fail(var, "not set")
        return None
    try:
        value = int(raw)
    except ValueError:
        fail(var, f"not an integer: {raw!r}")
        return None
    if value < minimum:
        fail(var, f"{value} < {minimum}")
        return None
    return value


def need_str(var: str) -> str | None:
    """The variable when set and non-empty."""
    value = os.environ.get(var)
    if not value:
        fail(var, "not set" if value is None else "empty")
        return None
    return value


def check_in_range(var: str, value: int | None, bound: int | None, bound_var: str) -> None:
    """0 <= value < bound, once both are known."""
    if value is not None and bound is not None and not value < bound:
        fail(var, f"{value} is not < {bound_var}={bound}")


def check_treb() -> None:
    """What trebuchet adds under every launcher: the rendezvous point and TREB_*."""
    need_str("MASTER_ADDR")
    port = need_int("MASTER_PORT", 1)
    if port is not None and port > 65535:
        fail("MASTER_PORT", f"{port} is not a TCP port")
    need_str("TREB_RUN_ID")
    run_dir = need_str("TREB_RUN_DIR")
    if run_dir is not None and not os.path.isdir(run_dir):
        fail("TREB_RUN_DIR", f"{run_dir} is not an existing directory")
    need_int("TREB_ATTEMPT")
    need_str("TREB_CHECKPOINT_DIR")


def check_none() -> tuple[int | None, int | None]:
    """launcher none: one process per node, which is its rank."""
    check_treb()
    node_rank = need_int("NODE_RANK")
    num_nodes = need_int("NUM_NODES", 1)
    check_in_range("NODE_RANK", node_rank, num_nodes, "NUM_NODES")
    need_int("LOCAL_WORLD_SIZE", 1)
    return node_rank, num_nodes


def check_ranks() -> tuple[int | None, int | None, int | None, int | None, int | None]:
    """The per-rank variables that torchrun and the native launcher both set."""
    rank = need_int("RANK")
    world = need_int("WORLD_SIZE", 1)
    local_rank = need_int("LOCAL_RANK")
    local_world = need_int("LOCAL_WORLD_SIZE", 1)
    group_rank = need_int("GROUP_RANK")
    check_in_range("RANK", rank, world, "WORLD_SIZE")
    check_in_range("LOCAL_RANK", local_rank, local_world, "LOCAL_WORLD_SIZE")
    return rank, world, local_rank, local_world, group_rank


def check_torchrun() -> tuple[int | None, int | None]:
    """launcher torchrun: torchrun sets the rank variables (no NODE_RANK nor NUM_NODES)."""
    check_treb()
    rank, world, _, _, _ = check_ranks()
    return rank, world


def check_native() -> tuple[int | None, int | None]:
    """launcher native: one process per rank with the full set of variables."""
    check_treb()
    rank, world, local_rank, local_world, group_rank = check_ranks()
    node_rank = need_int("NODE_RANK")
    num_nodes = need_int("NUM_NODES", 1)
    check_in_range("NODE_RANK", node_rank, num_nodes, "NUM_NODES")
    if group_rank is not None and node_rank is not None and group_rank != node_rank:
        fail("GROUP_RANK", f"{group_rank} != NODE_RANK={node_rank}")
    layout = (rank, node_rank, local_world, local_rank)
    if None not in layout and rank != node_rank * local_world + local_rank:
        fail(
            "RANK",
            f"{rank} != NODE_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK = "
            f"{node_rank}*{local_world}+{local_rank}",
        )
    if None not in (world, num_nodes, local_world) and world != num_nodes * local_world:
        fail("WORLD_SIZE", f"{world} != NUM_NODES*LOCAL_WORLD_SIZE = {num_nodes}*{local_world}")
    if os.environ.get("PYTHONUNBUFFERED") != "1":
        fail("PYTHONUNBUFFERED", f"expected '1', got {os.environ.get('PYTHONUNBUFFERED')!r}")
    need_int("OMP_NUM_THREADS", 1)
    return rank, world


def serve(port: int, world: int) -> None:
    """Rank 0: accept one hello from each other rank and answer it."""
    # All interfaces: MASTER_ADDR names this host, but a hostname may resolve to a loopback
    # alias locally (127.0.1.1) while the other nodes reach it on its real address.
    if socket.has_dualstack_ipv6():
        # create_server sets SO_REUSEADDR on POSIX: a rerun need not wait out TIME_WAIT.
        server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    else:
        server = socket.create_server(("", port))
    seen: set[int] = set()
    deadline = time.monotonic() + ACCEPT_WINDOW_S
    with server:
        while len(seen) < world - 1:
            server.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                conn, addr = server.accept()
            except TimeoutError:
                missing = sorted(set(range(1, world)) - seen)
                fail("MASTER_PORT", f"no hello from ranks {missing} within {ACCEPT_WINDOW_S:.0f}s")
                return
            with conn:
                conn.settimeout(IO_TIMEOUT_S)
                line = conn.makefile("r").readline().strip()
                prefix = "hello from rank "
                peer = line[len(prefix) :]
                if not line.startswith(prefix) or not peer.isdigit():
                    print(f"rank 0: ignoring {line!r} from {addr}", file=sys.stderr)
                    continue
                peer_rank = int(peer)
                if not 0 < peer_rank < world or peer_rank in seen:
                    fail("RANK", f"rank 0 got an unexpected or duplicate hello from {peer_rank}")
                    continue
                seen.add(peer_rank)
                conn.sendall(f"welcome {peer_rank}\n".encode())
    print(f"all {world} ranks said hello", flush=True)


def greet(addr: str, port: int, rank: int) -> None:
    """Other ranks: connect to rank 0 (retrying while it starts) and expect a welcome."""
    deadline = time.monotonic() + CONNECT_WINDOW_S
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=IO_TIMEOUT_S)
            break
        except OSError as err:
            if time.monotonic() > deadline:
                fail(
                    "MASTER_ADDR",
                    f"cannot reach rank 0 at {addr}:{port} within {CONNECT_WINDOW_S:.0f}s: {err}",
                )
                return
            time.sleep(0.2)
    with conn:
        conn.sendall(f"hello from rank {rank}\n".encode())
        reply = conn.makefile("r").readline().strip()
    if reply != f"welcome {rank}":
        fail("MASTER_PORT", f"rank 0 answered {reply!r} instead of 'welcome {rank}'")


def main() -> int:
    if "RANK" not in os.environ and "NODE_RANK" in os.environ:
        rank, world = check_none()
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        rank, world = check_torchrun()
    elif "RANK" in os.environ:
        rank, world = check_native()
    else:
        fail("RANK", "not set (nor NODE_RANK): not started by a trebuchet launcher")
        return 3
    if failures or rank is None or world is None:
        return 3
    port = int(os.environ["MASTER_PORT"])
    # torchrun's agent already holds MASTER_PORT for its own store: use the next port then.
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        port += 1
    if rank == 0:
        serve(port, world)
    else:
        greet(os.environ["MASTER_ADDR"], port, rank)
    if failures:
        return 3
    print(f"rank {rank} ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
