"""Time from `treb run --on ssh` to all 4 ranks running (2 hosts x 2), against the
hand-written loop it replaces (`ssh host torchrun ...` per host, in the background), on the
ssh test hosts (tests/ssh_hosts/hosts.sh up; TREB_SSH_CONFIG). Each rank writes the time
it started; a launch's figure is the last rank's start minus the launch's own start.
Alternating rounds, medians reported. Run: make bench-ssh (or with the hosts up:
python bench/ssh_launch.py [ROUNDS]).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONF = os.environ.get("TREB_SSH_CONFIG", "/var/tmp/treb-ssh-hosts/ssh_config")
HOSTS = ["ts1", "ts2"]
BIN = Path(sys.executable).parent
STAMP = 'python3 -c "import time; print(repr(time.time()))" > {d}/rank-$RANK'


def last_start(d: Path) -> float:
    stamps = [float(p.read_text()) for p in d.glob("rank-*")]
    assert len(stamps) == 4, f"{len(stamps)} ranks started"
    return max(stamps)


def treb(d: Path, home: Path) -> float:
    spec = d / "job.yaml"
    spec.write_text(
        f"name: bench\ncommand: {STAMP.format(d=d)!r}\nnodes: 2\nprocs_per_node: 2\n"
        f"snapshot: false\nssh: {{hosts: [ts1, ts2], config_file: {CONF}}}\n"
    )
    env = {**os.environ, "TREB_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}"}
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "ssh"],
                   check=True, env=env, capture_output=True)  # fmt: skip
    return last_start(d) - t0


def loop(d: Path) -> float:
    """The shell loop a team writes: torchrun per host over ssh, node 0 the master."""
    cmd = f"sh -c {shlex.quote(STAMP.format(d=d))}"
    t0 = time.time()
    procs = []
    for i, host in enumerate(HOSTS):
        remote = (
            f"cd {d} && {BIN}/torchrun --nnodes 2 --nproc_per_node 2 --node_rank {i} "
            f"--master_addr 10.78.0.11 --master_port 29600 --no-python {cmd}"
        )
        procs.append(
            subprocess.Popen(
                ["ssh", "-F", CONF, host, remote],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    for p in procs:
        assert p.wait() == 0, "the ssh loop failed"
    return last_start(d) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", type=int, nargs="?", default=5, help="alternating rounds")
    rounds = ap.parse_args().rounds
    times: dict[str, list[float]] = {"treb run --on ssh": [], "ssh host torchrun loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        for r in range(rounds):
            for name in times:
                d = Path(tmp) / f"{r}-{len(times[name])}-{name.split()[0]}"
                d.mkdir()
                times[name].append(treb(d, home) if name.startswith("treb") else loop(d))
    for name, ts in times.items():
        print(
            f"{name:26s} median {statistics.median(ts):.2f}s  "
            f"(min {min(ts):.2f}, max {max(ts):.2f}, {rounds} rounds)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
