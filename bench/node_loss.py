"""Time from a node's death to all ranks of the next attempt running (issue 23), and from
the loss's detection (the `node_lost` event) to that restart alone, over ssh.

On the ssh test hosts with three of them (TREB_SSH_HOST_COUNT=3 scripts/with-ssh-hosts):
a run with `nodes: 2`, `spare_nodes: 1`, `retries: 1` on ts1..ts3; once both ranks run
(each writes the time it started), ts2 dies as a machine does: its link down, then every
process in its namespace SIGKILLed (sshd, the agent, the rank). The next attempt's ranks
(on ts1 and the spare ts3) write their start times; the round's figures are the last of
those minus the kill, and minus the event's time. The run is then cancelled and ts2
brought back for the next round. Medians of ROUNDS.

Usage (root): TREB_SSH_HOST_COUNT=3 scripts/with-ssh-hosts \\
    python bench/node_loss.py --on ssh [--rounds 5] [--node-timeout 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/dead_machine.py
sys.path.insert(0, str(REPO / "bench"))
from common import wait  # noqa: E402

from tests.dead_machine import kill_namespace  # noqa: E402

HOSTS_SH = REPO / "tests" / "ssh_hosts" / "hosts.sh"
CONF = os.environ.get("TREB_SSH_CONFIG", "/var/tmp/treb-ssh-hosts/ssh_config")
STAMP = """import os, time
path = os.path.join(os.environ["STAMPS"], f"{os.environ['TREB_ATTEMPT']}-{os.environ['RANK']}")
with open(path + ".tmp", "w") as fh:
    fh.write(repr(time.time()))
os.replace(path + ".tmp", path)
"""


def sh(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=300)


def kill_host(name: str) -> None:
    kill_namespace(name, f"tssh-{name}")


def restore(name: str) -> None:
    sh("ip", "link", "set", f"tssh-{name}", "up")
    res = sh("bash", str(HOSTS_SH), "up", env={**os.environ, "TREB_SSH_HOST_COUNT": "3"})
    if res.returncode != 0:
        raise SystemExit(f"cannot bring {name} back: {res.stderr[-500:]}")


def stamps(d: Path, attempt: int) -> list[float]:
    out = []
    for p in d.glob(f"{attempt}-*"):
        with contextlib.suppress(ValueError, OSError):
            out.append(float(p.read_text()))
    return out


def one_round(work: Path, node_timeout: float) -> tuple[float, float, float]:
    """(death -> next attempt's ranks all running, detection -> same, death -> detection)"""
    home, d = work / "home", work / "stamps"
    d.mkdir(parents=True)
    (work / "stamp.py").write_text(STAMP)
    command = f"{sys.executable} {work / 'stamp.py'} && exec sleep 600"
    spec = work / "job.yaml"
    spec.write_text(
        f"name: bench-node-loss\ncommand: {json.dumps(command)}\n"
        "nodes: 2\nspare_nodes: 1\nretries: 1\n"
        f"node_timeout: {node_timeout:g}s\ngrace_period: 2\nsnapshot: false\n"
        f"env: {{STAMPS: {json.dumps(str(d))}}}\n"
        f"ssh: {{hosts: [ts1, ts2, ts3], config_file: {CONF}}}\n"
    )
    env = {**os.environ, "TREB_HOME": str(home),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    treb = [sys.executable, "-m", "trebuchet"]
    res = sh(*treb, "run", str(spec), "--on", "ssh", "--detach", env=env)
    if res.returncode != 0:
        raise SystemExit(res.stderr)
    [run_dir] = list((home / "runs").iterdir())
    wait(lambda: len(stamps(d, 0)) == 2, 120, "attempt 0's ranks")
    time.sleep(1.0)  # a heartbeat from each agent on record
    killed = time.time()
    kill_host("ts2")
    wait(lambda: len(stamps(d, 1)) == 2, 120, "attempt 1's ranks")
    running = max(stamps(d, 1))
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    detected = next(e["time"] for e in events if e["event"] == "node_lost")
    sh(*treb, "cancel", run_dir.name, env=env)
    wait(lambda: '"run_ended"' in (run_dir / "events.jsonl").read_text(), 60, "the cancel")
    restore("ts2")
    return running - killed, running - detected, detected - killed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--on", default="ssh", choices=["ssh"], help="the engine (ssh only here)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--node-timeout", type=float, default=5.0)
    args = ap.parse_args()
    if os.getuid() != 0:
        raise SystemExit("needs root (a test host is killed and brought back)")
    restore("ts2")  # all three up
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="treb-bench-loss-") as tmp:
            row = one_round(Path(tmp), args.node_timeout)
        rows.append(row)
        print(f"round {i + 1}: death -> ranks running {row[0]:.2f}s, detection -> running "
              f"{row[1]:.2f}s, death -> detection {row[2]:.2f}s", flush=True)  # fmt: skip
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"median of {len(rows)} (node_timeout {args.node_timeout:g}s): death -> all ranks of "
          f"the next attempt running {med[0]:.2f}s; detection -> restart {med[1]:.2f}s; "
          f"death -> detection {med[2]:.2f}s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
