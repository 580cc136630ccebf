"""Time from launch to all horovod ranks running (past hvd.init(), 2 hosts x 1), `treb run
--on ssh` with `launcher: horovod` against a hand-written horovodrun on the same hosts
(`ssh ts1 horovodrun -np 2 -H 10.78.0.11:1,10.78.0.12:1 -p 22 --ssh-identity-file KEY
--network-interfaces eth0 ...`, as Determined starts it), on the ssh test hosts
(tests/ssh_hosts/hosts.sh up; TREB_SSH_CONFIG) with horovod in this venv. Each rank writes
the time hvd.init() returned; a launch's figure is the last rank's minus the launch's own
start. Alternating rounds, medians reported. Run (hosts up):
`scripts/with-ssh-hosts .venv/bin/python bench/horovod_ssh.py [ROUNDS]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONF = os.environ.get("TREB_SSH_CONFIG", "/var/tmp/treb-ssh-hosts/ssh_config")
KEY = str(Path(CONF).parent / "id_ed25519")
BIN = Path(sys.executable).parent
PROG = (
    "import os, sys, time; import horovod.torch as hvd; hvd.init(); "
    "open(os.path.join(sys.argv[1], 'rank-%d' % hvd.rank()), 'w').write(repr(time.time()))"
)


def last_init(d: Path) -> float:
    stamps = [float(p.read_text()) for p in d.glob("rank-*")]
    assert len(stamps) == 2, f"{len(stamps)} ranks started"
    return max(stamps)


def treb(d: Path, home: Path) -> float:
    (d / "prog.py").write_text(PROG)
    spec = d / "job.yaml"
    spec.write_text(
        f"name: bench\ncommand: {sys.executable} {d}/prog.py {d}\nlauncher: horovod\n"
        f"nodes: 2\nprocs_per_node: 1\nsnapshot: false\n"
        f"ssh: {{hosts: [ts1, ts2], config_file: {CONF}, setup: ['export PATH={BIN}:$PATH']}}\n"
    )
    env = {**os.environ, "TREB_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}"}
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "ssh"],
                   check=True, env=env, capture_output=True)  # fmt: skip
    return last_init(d) - t0


def by_hand(d: Path) -> float:
    (d / "prog.py").write_text(PROG)
    remote = (
        f"cd {d} && PATH={BIN}:$PATH horovodrun -np 2 -H 10.78.0.11:1,10.78.0.12:1 -p 22 "
        f"--ssh-identity-file {KEY} --network-interfaces eth0 --gloo "
        f"{sys.executable} {d}/prog.py {d}"
    )
    t0 = time.time()
    subprocess.run(["ssh", "-F", CONF, "ts1", remote], check=True, capture_output=True)
    return last_init(d) - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rounds", type=int, nargs="?", default=5, help="alternating rounds")
    rounds = ap.parse_args().rounds
    times: dict[str, list[float]] = {"treb run --on ssh": [], "ssh ts1 horovodrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        for r in range(rounds):
            for name in times:
                d = Path(tmp) / f"{r}-{name.split()[0]}"
                d.mkdir()
                times[name].append(treb(d, home) if name.startswith("treb") else by_hand(d))
    for name, ts in times.items():
        print(
            f"{name:22s} median {statistics.median(ts):.2f}s  "
            f"(min {min(ts):.2f}, max {max(ts):.2f}, {rounds} rounds)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
