"""`launcher: horovod`: horovodrun's command line, built where it runs, and what a rank's
worker adds on its own host.

Why here (the runtime, not the submitting side): over ssh horovodrun starts on node 0,
whose interface names are only known there. One launcher for the whole run, as Determined
starts it (seed 002): `horovodrun -np N -H host:slots,... [-p PORT] [--ssh-identity-file F]
--start-timeout S [--gloo-timeout-seconds S] [--gloo|--mpi] [--network-interfaces X]`.

The controller and timeouts come from the spec's env under Horovod's own names:
HOROVOD_CONTROLLER (gloo, the default; mpi), HOROVOD_START_TIMEOUT and
HOROVOD_GLOO_TIMEOUT_SECONDS (seconds, default 120 each).

Hosts that name their interfaces differently (eth0 here, ens5 there): horovodrun's own
search for a common interface fails ("no common interface"). Across hosts treb gives it
node 0's interface toward the others (gloo: its name, for the rendezvous server's address;
MPI: its subnet, which OpenMPI matches on every host), and under gloo each rank's worker
sets HOROVOD_GLOO_IFACE to its own host's interface toward that server (`pick_iface`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..contracts.schema import JobFile
    from .agent import Proc

CONTROLLERS = ("gloo", "mpi")
DEFAULT_TIMEOUT_S = 120
MAX_TIMEOUT_S = 7 * 24 * 3600
PICK_IFACE = "TREB_HOROVOD_PICK_IFACE"  # set on the launcher: each worker picks its iface
_SIOCGIFADDR, _SIOCGIFNETMASK = 0x8915, 0x891B


def env_problem(env: dict[str, str]) -> tuple[str, str] | None:
    """The spec's HOROVOD_* setting that cannot be used: (its field, why), or None."""
    ctl = env.get("HOROVOD_CONTROLLER", "gloo")
    if ctl not in CONTROLLERS:
        return "env.HOROVOD_CONTROLLER", f"must be gloo or mpi, got {ctl[:40]!r}"
    for name in ("HOROVOD_START_TIMEOUT", "HOROVOD_GLOO_TIMEOUT_SECONDS"):
        value = env.get(name)
        if value is None:
            continue
        if not (value.isdigit() and len(value) < 9 and 1 <= int(value) <= MAX_TIMEOUT_S):
            why = f"must be whole seconds from 1 to {MAX_TIMEOUT_S}, got {value[:40]!r}"
            return f"env.{name}", why
    return None


def slurm_problem(env: dict[str, str]) -> tuple[str, str] | None:
    """What Slurm cannot run: horovodrun's gloo starts remote ranks over ssh, which a Slurm
    allocation does not offer; there horovod runs under mpirun (OpenMPI's daemons started by
    srun, the MPI controller), as `launcher: mpirun` does."""
    bad = env_problem(env)
    if bad is None and env.get("HOROVOD_CONTROLLER") == "gloo":
        why = (
            "gloo is not available on the slurm backend (horovodrun would start the ranks "
            "over ssh): horovod runs under mpirun there; remove it or set mpi"
        )
        return "env.HOROVOD_CONTROLLER", why
    return bad


def controller(env: dict[str, str]) -> str:
    """gloo or mpi (HOROVOD_CONTROLLER; gloo by default: it needs no MPI on the hosts)."""
    ctl = env.get("HOROVOD_CONTROLLER", "gloo")
    return ctl if ctl in CONTROLLERS else "gloo"


def _seconds(env: dict[str, str], name: str) -> int:
    value = env.get(name, "")
    return int(value) if value.isdigit() and int(value) >= 1 else DEFAULT_TIMEOUT_S


def horovodrun_argv(
    np: int,
    hosts: list[str],
    slots: int,
    env: dict[str, str],
    ssh_port: int | None = None,
    ssh_identity: str | None = None,
    nics: str | None = None,
) -> list[str]:
    """horovodrun's options (before the command) for `np` ranks, `slots` per host."""
    ctl = controller(env)
    argv = ["horovodrun", "-np", str(np), "-H", ",".join(f"{h}:{slots}" for h in hosts),
            "--start-timeout", str(_seconds(env, "HOROVOD_START_TIMEOUT")),
            f"--{ctl}"]  # fmt: skip
    if ctl == "gloo":
        argv += ["--gloo-timeout-seconds", str(_seconds(env, "HOROVOD_GLOO_TIMEOUT_SECONDS"))]
    if ssh_port:
        argv += ["-p", str(ssh_port)]
    if ssh_identity:
        argv += ["--ssh-identity-file", ssh_identity]
    if nics:
        argv += ["--network-interfaces", nics]
    return argv


def interfaces() -> list[tuple[str, str, str]]:
    """This host's IPv4 interfaces: (name, address, netmask), from the kernel (ioctl)."""
    out: list[tuple[str, str, str]] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
                mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFNETMASK, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            out.append((name, addr, mask))
    return out


def route_to(peer: str) -> tuple[str, str] | None:
    """The interface this host reaches `peer` through: (name, its subnet as a.b.c.d/n), or
    None (no route, a name that does not resolve). A UDP connect sends nothing."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((peer, 9))
            local = s.getsockname()[0]
    except OSError:
        return None
    for name, addr, mask in interfaces():
        if addr == local:
            net = ipaddress.IPv4Network(f"{addr}/{mask}", strict=False)
            return name, str(net)
    return None


def launcher_nics(env: dict[str, str], peers: list[str]) -> str | None:
    """--network-interfaces for a run across hosts, from node 0: its interface toward the
    first other host (gloo: the name; mpi: the subnet), or None (horovodrun's own search)."""
    found = route_to(peers[0]) if peers else None
    if found is None:
        return None
    return found[0] if controller(env) == "gloo" else found[1]


def pick_iface(env: dict[str, str]) -> None:
    """In a gloo rank's worker, on its own host: HOROVOD_GLOO_IFACE set to this host's
    interface toward the rendezvous server (horovodrun gave every host node 0's name)."""
    if env.get(PICK_IFACE) != "1" or env.get("HOROVOD_CONTROLLER") != "gloo":
        return
    server = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    with contextlib.suppress(OSError, ValueError):
        found = route_to(server) if server else None
        if found is not None:
            env["HOROVOD_GLOO_IFACE"] = found[0]


def rank_records(adir: str, names: list[str]) -> list[dict[str, object] | None]:
    """The records `names` in `adir`, None for one absent or no JSON object: regular files
    only (a rank can put a FIFO there), read whole up to 1 MiB."""
    from ..rundir.records import read_json

    out: list[dict[str, object] | None] = []
    for name in names:
        rec = read_json(os.path.join(adir, name), 1 << 20)
        out.append(rec if isinstance(rec, dict) else None)
    return out


def wait(args: list[str]) -> int:
    """`horovod-wait ADIR LIMIT_S RANK...`: a node other than node 0 over ssh, where
    horovodrun (on node 0) starts this host's ranks through its own ssh. The node's agent
    runs this so that its session lasts as long as those ranks: it ends when each of their
    records says ENDED (their outcome is theirs, not this process's: exit 0), or when none
    started within LIMIT_S (horovodrun's start timeout names that). The session's end stops
    the agent, whose last step ends what still carries this run and node (node.end_strays).
    The checkpoint signals the agent sends here (the timeout's warning, on_hang retry) go on
    to the ranks that handle them, which are not this process's children."""
    import signal
    import time

    from ..process import procs

    adir, limit = args[0], float(args[1])
    names = [f"rank-{r}.json" for r in args[2:]]

    def forward(sig: int, _frame: object) -> None:
        run_id = os.environ.get("TREB_RUN_ID", "")
        for rec in rank_records(adir, names):
            pid = rec.get("pid") if rec else None
            running = rec is not None and rec.get("state") == "RUNNING"
            if isinstance(pid, int) and running and procs.in_run(pid, run_id):
                for p in procs.catchers(pid, sig):
                    procs.signal_pid(p, sig)

    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    began = time.monotonic()
    while True:
        states = [rec.get("state") if rec else None for rec in rank_records(adir, names)]
        if states and all(s == "ENDED" for s in states):
            return 0
        if all(s is None for s in states) and time.monotonic() - began > limit:
            return 0
        time.sleep(0.2)


def node_procs(job: JobFile, env: dict[str, str], adir: str, node: int, nnodes: int) -> list[Proc]:
    """Over ssh (the node verb): node 0 runs horovodrun for every host (job.json's
    `horovod`: the hosts' addresses, ssh port and identity, as the ssh engine resolved
    them); every other node waits for its ranks (`wait`)."""
    from .agent import Proc
    from .task import self_argv

    ppn, cmd = int(job["ppn"]), list(job["command"])
    if node != 0:
        ranks = [str(node * ppn + local) for local in range(ppn)]
        limit = _seconds(env, "HOROVOD_START_TIMEOUT") + 60
        argv = [*self_argv(), "horovod-wait", adir, str(limit), *ranks]
        return [Proc(f"node-{node}", str(node), argv, env, node=node)]
    placed = job.get("horovod") or {}
    hosts = list(placed.get("hosts") or ["localhost"])[:nnodes]
    env = dict(env, LOCAL_WORLD_SIZE=str(ppn), WORLD_SIZE=str(nnodes * ppn))
    for name in ("NODE_RANK", "GROUP_RANK"):  # each rank's worker sets its own
        env.pop(name, None)
    nics = None
    if len(hosts) > 1:
        env[PICK_IFACE] = "1"
        nics = launcher_nics(env, hosts[1:])
    argv = horovodrun_argv(nnodes * ppn, hosts, ppn, env, placed.get("port"),
                           placed.get("identity"), nics)  # fmt: skip
    worker = [*self_argv(), "worker", "--grace", str(job["grace"]), "--mpi", str(ppn)]
    return [Proc("node-0", "0", [*argv, *worker, "--", *cmd], env, node=0, launcher=True)]


SHUTDOWN = b"Horovod has been shut down. This was caused by an exception on one of the ranks"


TRACEBACK = b"Traceback (most recent call last):"
CHAINED = (  # what Python prints between the tracebacks of one chain of exceptions
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
IGNORED = b"Exception ignored in"  # a __del__'s traceback at exit: after the real one
QUOTE_LINES = 5  # no traceback: horovod's word within the last lines (caught and printed)


def peer_shutdown(log: str) -> bool:
    """Whether a rank's log ends with horovod's word that another rank failed first (its
    own exception is then a cascade: under the MPI controller it can exit before the rank
    that caused it, which must stay the first failure). The log's last 64 KiB: the word in
    its last chain of tracebacks (horovod's RuntimeError, then HorovodInternalError, or an
    error raised from it), or, with no traceback, in its last lines. A log that quotes it
    (a hint the program prints, an error it caught and went on) and then fails on an
    error of its own is no cascade: that rank is its own failure, never its stopped peer
    (records.left_first would name it). The word counts as horovod's exception says it: at
    a line's start, or after the exception's name (`HorovodInternalError: `), never inside
    a line of the program's own (`hint: if you see 'Horovod has been shut down...'`)."""
    from ..rundir.regular import open_regular

    try:
        with open_regular(log) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - 65536))
            data = fh.read(65536)
    except OSError:
        return False
    if SHUTDOWN not in data:
        return False
    import re

    # bounded: an exception's name is short (`[\w.]*` on a 64 KiB line of `ErrorError...`
    # backtracked for ~0.8 s of the agent's reap)
    name = rb"[\w.]{0,200}(?:Error|Exception)\w{0,40}: "
    said = re.compile(rb"(?m)^(?:" + name + rb")?" + re.escape(SHUTDOWN))
    start = _last_chain(data)
    if start is None:
        return said.search(b"\n".join(data.rstrip().splitlines()[-QUOTE_LINES:])) is not None
    return said.search(data, start) is not None


def _last_chain(data: bytes) -> int | None:
    """Where the log's last chain of tracebacks starts (those of `Exception ignored in`,
    printed at exit after it, are no part of it); None without a traceback."""
    starts, at = [], data.find(TRACEBACK)
    while at >= 0:
        line = data[data.rfind(b"\n", 0, max(at - 1, 0)) + 1 : at]
        if IGNORED not in line:
            starts.append(at)
        at = data.find(TRACEBACK, at + 1)
    while len(starts) > 1 and data[: starts[-1]].rstrip().endswith(CHAINED):
        starts.pop()
    return starts[-1] if starts else None
