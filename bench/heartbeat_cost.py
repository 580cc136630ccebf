"""The agents' heartbeat on the job controller's CPU (runtime/job/link.py).

A controller process holds the Hub and nothing else; a second process holds N agent Links
(each beating every BEAT_S from its own thread, as the Slurm task agents do). After a
warm-up, the controller's CPU seconds over the window are read from /proc, against the
same controller with no agent connected. Goal (issue 23): < 0.5 % of one core for 64 ranks.

Usage: python bench/heartbeat_cost.py [--agents 64] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HUB = """
import os, sys, time
from trebuchet.runtime import agent_link
r, w = os.pipe()
hub = agent_link.Hub(w)
hub.expect(0, int(sys.argv[1]))
print(hub.address("127.0.0.1"), flush=True)
time.sleep(3600)
"""

AGENTS = """
import os, sys, time
from trebuchet.runtime import agent_link
links = [agent_link.open_link(0, str(i), "n%d" % (i // 8)) for i in range(int(sys.argv[1]))]
print(sum(link is not None for link in links), flush=True)
time.sleep(3600)
"""


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(agents: int, seconds: float) -> float:
    hub = subprocess.Popen([sys.executable, "-c", HUB, str(agents)], stdout=subprocess.PIPE,
                           text=True)  # fmt: skip
    assert hub.stdout is not None
    address = hub.stdout.readline().strip()
    peers = None
    try:
        if agents:
            env = {**os.environ, "TREB_CONTROLLER_LINK": address}
            peers = subprocess.Popen([sys.executable, "-c", AGENTS, str(agents)], env=env,
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
            assert peers.stdout is not None and int(peers.stdout.readline()) == agents
        time.sleep(3)  # warm-up: connections made, first beats read
        before = cpu_seconds(hub.pid)
        time.sleep(seconds)
        return (cpu_seconds(hub.pid) - before) / seconds
    finally:
        for proc in (peers, hub):
            if proc is not None:
                proc.kill()
                proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    idle = measure(0, args.seconds)
    busy = measure(args.agents, args.seconds)
    print(f"controller CPU: {100 * idle:.3f} % of a core with no agent, "
          f"{100 * busy:.3f} % with {args.agents} beating agents "
          f"(heartbeat: +{100 * (busy - idle):.3f} %)")  # fmt: skip


if __name__ == "__main__":
    main()
