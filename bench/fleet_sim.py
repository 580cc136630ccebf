"""A simulated fleet of node agents against the job controller's link (runtime/job/link.py).

What saturates first when a job has thousands of nodes is the controller's own work: one
TCP connection per agent, a heartbeat from each every BEAT_S, a lost node to notice within
`node_timeout`. Slurm cannot give this machine 4,096 nodes; the protocol can be given 4,096
agents. Here the controller's real `Hub` (the listening socket and the thread that reads the
agents' lines, exactly as runtime/slurm/step.py uses it) runs in this process, and WORKERS
processes play the agents with the real wire format (`link.encode`): each opens its share
of connections, says hello, sends a heartbeat every BEAT_S (spread over the interval, as
agents that started at different times would), and at the end says `ended`. One agent, on
its own host, falls silent half-way: the controller must name that host within
node_timeout + 1 s. What is simulated: the agents (no ranks, no node agent's own work);
what is real: the controller's sockets, selector, locking and line handling, and the
kernel's TCP on loopback.

Figures: the time until every agent is connected and heard (a listen backlog or a file
limit that is too small shows here as agents that give up, CONNECT_S), the controller
process's CPU over the steady heartbeats (in % of one core), the lost node's detection
delay past node_timeout, and the time from the last `ended` to `Hub.ended()`.

Usage: python bench/fleet_sim.py [--agents 4096] [--workers 4] [--node-timeout 5]
       [--steady 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

from trebuchet.runtime.job import link  # noqa: E402


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def worker(port: int, token: str, first: int, count: int, silent: int, quiet_at: float,
           end_at: float) -> None:  # fmt: skip
    """`count` agents, tasks first..first+count-1; the task `silent` stops beating at
    `quiet_at` (monotonic, this host's clock: the parent's); all say ended at `end_at`."""
    _raise_nofile()
    socks: list[socket.socket | None] = []
    failed = 0
    for i in range(first, first + count):
        try:
            s = socket.create_connection(("127.0.0.1", port), link.CONNECT_S)
            host = "lost-host" if i == silent else f"sim-{i}"
            s.sendall(link.encode("hello", token, 0, str(i), host))
            s.setblocking(False)
            socks.append(s)
        except OSError:
            failed += 1
            socks.append(None)
    print(f"connected {count - failed} failed {failed}", flush=True)
    start = time.monotonic()
    n = 0
    while time.monotonic() < end_at:
        # each agent beats every BEAT_S, the agents spread evenly over the interval
        for k, s in enumerate(socks):
            if s is None:
                continue
            i = first + k
            due = start + link.BEAT_S * (n + k / max(1, count))
            while time.monotonic() < due:
                time.sleep(min(0.01, max(0.0, due - time.monotonic())))
            if i == silent and time.monotonic() >= quiet_at:
                continue
            try:
                s.send(link.encode("beat", token, 0, str(i), "-"))
                s.recv(4096)  # the answers so far (an agent reads them in its beat)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                socks[k] = None
        n += 1
    for k, s in enumerate(socks):
        if s is not None:
            i = first + k
            try:
                s.setblocking(True)
                s.sendall(link.encode("ended", token, 0, str(i), "0"))
            except OSError:
                pass
    print("ended", flush=True)
    time.sleep(1.0)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--node-timeout", type=float, default=5.0)
    ap.add_argument("--steady", type=float, default=20.0)
    ap.add_argument("--worker", nargs=7, type=float, help=argparse.SUPPRESS)
    ap.add_argument("--token", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        port, first, count, silent, quiet, end, _ = args.worker
        worker(int(port), args.token, int(first), int(count), int(silent), quiet, end)
        return
    _raise_nofile()
    r, w = os.pipe()
    os.set_blocking(r, False)
    hub = link.Hub(w)
    hub.expect(0, args.agents)
    t0 = time.monotonic()
    connect_s = 10.0  # the workers' connections and hellos
    quiet_at = t0 + connect_s + args.steady
    end_at = quiet_at + args.node_timeout + 5.0
    silent = args.agents // 2
    share = -(-args.agents // args.workers)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    procs = []
    for wi in range(args.workers):
        first = wi * share
        count = max(0, min(share, args.agents - first))
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--token", hub.token, "--worker", str(hub.port),
             str(first), str(count), str(silent), str(quiet_at), str(end_at), "0"],
            stdout=subprocess.PIPE, text=True, env=env))  # fmt: skip
    # every agent heard
    while len(hub.tasks) < args.agents and time.monotonic() < t0 + connect_s:
        time.sleep(0.05)
    heard_s = time.monotonic() - t0
    heard = len(hub.tasks)
    while time.monotonic() < t0 + connect_s:
        time.sleep(0.05)
    # steady heartbeats: the controller's CPU (its reader thread and a 0.2 s poll of lost()
    # and ended(), as the job controller's loop does)
    c0, w0 = cpu_s(), time.monotonic()
    while time.monotonic() < quiet_at:
        hub.lost(args.node_timeout)
        hub.ended()
        time.sleep(0.2)
    steady_pct = 100 * (cpu_s() - c0) / (time.monotonic() - w0)
    found_at = None
    while time.monotonic() < end_at:
        lost = hub.lost(args.node_timeout)
        if lost and found_at is None:
            found_at = time.monotonic()
            names = [x.host for x in lost]
            late = lost[0].silent - args.node_timeout  # past node_timeout, from its last beat
        hub.ended()
        time.sleep(0.2)
    last_end = time.monotonic()
    done = None
    while time.monotonic() < last_end + 10:
        if hub.ended() is not None:
            done = time.monotonic()
            break
        time.sleep(0.01)
    said = [p.communicate(timeout=30)[0].splitlines()[0] for p in procs]
    hub.close()
    print(f"# fleet simulation, {args.agents} agents in {args.workers} processes, {machine()}")
    print(f"agents heard: {heard} of {args.agents} in {heard_s:.2f} s (workers: {said})")
    print(f"controller CPU, steady heartbeats (every {link.BEAT_S:g} s): {steady_pct:.1f} % "
          "of one core")  # fmt: skip
    if found_at is None:
        print(f"lost node: NOT noticed within node_timeout {args.node_timeout:g} s + 5 s")
    else:
        print(f"lost node: {names} noticed {late:.2f} s past node_timeout "
              f"({args.node_timeout:g} s)")  # fmt: skip
    print("all ended: " + (f"{done - last_end:.3f} s after the last" if done else "NOT seen"))


if __name__ == "__main__":
    main()
