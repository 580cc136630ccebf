"""A test node or host dies as a machine does: its link goes down first (nothing it sends
gets out, no FIN, no RST), then every process in its network namespace is SIGKILLed
(slurmd or sshd, the node agent, the ranks). Used by the node-loss tests and benches."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def kill_namespace(netns: str, link: str) -> None:
    """`netns`: the node's network namespace; `link`: its veth end in the root namespace."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                          timeout=30).stdout.split()  # fmt: skip
    subprocess.run(["ip", "link", "set", link, "down"], check=True, timeout=30)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
