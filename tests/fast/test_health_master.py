"""The `master` health check never touches the master's port: a program with its own
rendezvous on MASTER_PORT (rank 0 accepts WORLD_SIZE-1 peers and reads a line from each)
took the check's connection for a peer when one node's check ran after another node's
ranks had started."""

from __future__ import annotations

import select
import socket
import subprocess
import sys

from tests.conftest import REPO
from trebuchet.runtime.node.health import check_master


def test_the_master_check_sends_nothing_to_a_listening_rank() -> None:
    with socket.socket() as rank0:
        rank0.bind(("127.0.0.1", 0))
        rank0.listen(8)
        port = rank0.getsockname()[1]
        ok, said = check_master("127.0.0.1", str(port), wait=0)
        waiting, _, _ = select.select([rank0], [], [], 0.5)
    assert ok, said
    assert not waiting, "the health check connected to the rank's port"


def test_a_master_that_does_not_resolve_is_unhealthy() -> None:
    ok, said = check_master("no-such-host.invalid", "29500", wait=0)
    assert not ok and "does not resolve" in said


def test_a_master_without_a_route_is_unhealthy() -> None:
    """A node with no route to MASTER_ADDR: a network namespace of its own (loopback only)."""
    code = (
        "from trebuchet.runtime.node.health import check_master; "
        "print(check_master('192.0.2.1', '29500', wait=0))"
    )
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("(False,") and "no route" in done.stdout, done.stdout
