"""The `node` verb: one node of an engine that starts one process per node itself (the
`run:` section of a SkyPilot task, the pod of a Kubernetes indexed Job):
`python3 -S <runtime> node <job.json>`.

The engine's few shell lines place the node (NODE_RANK, NUM_NODES, MASTER_ADDR,
MASTER_PORT, TREB_RUN_ID, TREB_RUN_DIR: a node-local folder, TREB_ATTEMPT); the rest is
the node agent's, as on every engine: the node's processes with the rank contract (native:
one per rank; torchrun: torchrun, each worker running `worker` around its rank; none: the
command once), each with its own log and outcome record in `TREB_RUN_DIR/attempt-<n>/`;
the first failure stops the others (SIGTERM, SIGKILL after the grace period); signals are
forwarded; the spec's timeout is enforced here, with the checkpoint signal before it, as
locally. Those engines keep what a node prints (`sky logs`, `kubectl logs`), so the ranks'
logs are also copied to stdout, line by line with their label (logcopy.py).

Started over ssh (the ssh engine sets TREB_NODE_STDIN=1), stdin is the session: its first
line is a JSON object of the secrets' values (never on a command line, where `ps` shows
them), and its end (the ssh connection dropped, the submitting `treb` died, or the engine
closed it to cancel) stops the node as SIGTERM does: nothing outlives its session.

Over ssh the node is a host of the user's, where nothing else ends what the ranks leave
behind (local runs have their cgroup, Slurm its step, a pod its container): when the
node's processes ended, what still carries the run's TREB_RUN_ID and this NODE_RANK (a
daemon that left its rank's process group, `setsid cmd &`) is killed, each attempt. The
session's script says how long the attempt ran before the agent started
(TREB_ATTEMPT_ELAPSED: the engine's `pre`; TREB_SESSION_UPTIME: when the session began,
before ssh.setup), so that the timeout counts from the attempt's start, as the engine's.

Exit code: the first failure's; 124 when the timeout stopped the node (as coreutils
`timeout`, which it replaces, said); 2 when the engine's lines left a variable unset or a
secret is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from ..contracts import rank_env as contract
from ..contracts import secrets
from ..job import nodeloss
from ..job.life import AttemptClock
from ..process import procs
from ..rundir.records import write_json
from ..watch import hung as hang
from ..watch import metric_reader as metrics
from . import barrier, health
from .agent import Agent, Proc
from .logcopy import LogCopy
from .task import native_procs, none_proc, self_argv, torchrun_proc

if TYPE_CHECKING:
    from ..contracts.schema import Hang, JobFile

PLACEMENT = ("NODE_RANK", "NUM_NODES", "MASTER_ADDR", "MASTER_PORT", "TREB_RUN_ID", "TREB_RUN_DIR")
TIMEOUT_EXIT = 124
SETUP_ENV_VAR = "TREB_SETUP_ENV_FD"  # ssh: the fd of the environment setup made (`env -0`)
SETUP_ENV_FD = 8
STRAYS_S = 5.0  # the most a sweep of leftovers takes (a D-state one dies when it can)
HANG_EXIT = 1  # the engine's retries (backoffLimitPerIndex, max_restarts) take it from here


def say(text: str) -> None:
    sys.stderr.write(f"treb: {text}\n")
    sys.stderr.flush()


def missing_placement(environ: dict[str, str]) -> str | None:
    """Why the engine's lines did not place this node, or None."""
    unset = [n for n in PLACEMENT if not environ.get(n)]
    if unset:
        return f"{', '.join(unset)} not set (the engine's lines before `node` set them)"
    for name in ("NODE_RANK", "NUM_NODES", "TREB_ATTEMPT"):
        if not (environ.get(name) or "0").isdigit():
            return f"{name}={environ[name]!r} is not a number"
    if int(environ["NODE_RANK"]) >= int(environ["NUM_NODES"]):
        return f"NODE_RANK {environ['NODE_RANK']} is not below NUM_NODES {environ['NUM_NODES']}"
    return None


def node_env(job: JobFile, run_dir: str, node: int, nnodes: int) -> dict[str, str]:
    """What every process of this node gets: the engine's environment, the node's contract
    variables, trebuchet's own (unless the spec's env sets them), the env values that use a
    secret, expanded here."""
    env = dict(os.environ)
    spec_env = set(job.get("spec_env", []))
    cwd = os.getcwd()
    ours = {
        "TREB_WORKDIR": cwd,
        "TREB_CODE_DIR": cwd,
        # storage the engine mounts for them (job.json), else the node-local run dir
        "TREB_CHECKPOINT_DIR": job.get("checkpoint_dir") or os.path.join(run_dir, "checkpoints"),
        "PYTHONUNBUFFERED": "1",
    }
    if job.get("profile") == "torch":
        ours["TREB_TORCH_PROFILE_DIR"] = os.path.join(run_dir, "profile", "torch")
    ranks = job.get("profile_ranks")
    if ranks is not None:
        ours["TREB_PROFILE_RANKS"] = " ".join(str(r) for r in ranks)
    for name, value in ours.items():
        if name not in spec_env:
            env[name] = value
    env["TREB_RUN_DIR"] = run_dir
    env.update(contract.node_vars(node, nnodes))
    names = set(job.get("secrets", []))
    for name, template in job.get("secret_env", {}).items():
        env[name] = secrets.resolve(template, names, os.environ)
    ppn = int(job["ppn"])
    if job["launcher"] != "none" and not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = contract.omp_threads(len(os.sched_getaffinity(0)), ppn)
    return env


def node_procs(
    job: JobFile, env: dict[str, str], adir: str, node: int, nnodes: int
) -> tuple[list[Proc], list[tuple[str, str]]]:
    """This node's processes, and the logs to copy to stdout (label, path)."""
    launcher, ppn, cmd = job["launcher"], int(job["ppn"]), list(job["command"])

    def log(name: str) -> str:
        return os.path.join(adir, name + ".log")

    ranks = [(node * ppn + local, local) for local in range(ppn)]
    rank_streams = [(f"{node}:{local}", log(f"rank-{rank}")) for rank, local in ranks]
    if launcher == "native":
        return native_procs(job, env, node, nnodes, ranks, job["run_id"]), rank_streams
    if launcher == "torchrun":
        worker = [*self_argv(), "worker", "--grace", str(job["grace"])]
        proc = torchrun_proc(env, node, nnodes, ppn, worker, cmd)
        return [proc], [(str(node), log(proc.name)), *rank_streams]
    if launcher == "horovod":  # horovodrun on node 0 for every host (runtime/node/horovodrun.py)
        from .horovodrun import node_procs as horovod_procs

        found = horovod_procs(job, env, adir, node, nnodes)
        return found, [(str(node), log(found[0].name)), *rank_streams]
    proc = none_proc(env, node, ppn, cmd)
    return [proc], [(str(node), log(proc.name))]


class Limit:
    """The spec's timeout on this node, from the agent's start: the checkpoint signal
    `warning` seconds before it, then every process is stopped (SIGTERM, SIGKILL after the
    grace period). A rank that dies of the checkpoint signal after the warning was stopped
    by it: that ends the node's ranks as the timeout would, and is no failure."""

    def __init__(self, job: JobFile, label: str, elapsed: float = 0.0) -> None:
        self.label = label
        self.sig_name = job.get("checkpoint_signal") or "SIGUSR2"
        self.sig = int(getattr(signal, self.sig_name))
        self.timeout: float | None = job.get("timeout")
        # `elapsed`: the attempt's time before this agent (the engine's pre, ssh.setup)
        self.clock = AttemptClock(time.monotonic() - elapsed, self.timeout, job.get("warning"))
        self.agent: Agent | None = None
        self.notes: list[str] = []  # said by the log copy thread, never from here
        self.warned = self.fired = self._warned_stop = False

    def tick(self) -> None:
        assert self.agent is not None
        now = time.monotonic()
        if not self.fired and self.clock.warn_due(now):
            self.warned = True
            left = max(0.0, (self.clock.timeout_at or now) - now)
            sent = self.agent.signal_all(self.sig)
            self.notes.append(
                f"{self.label}: timeout in {left:.0f}s: {self.sig_name} to the "
                f"{len(sent)} process(es) that handle it (checkpoint now)"
                if sent
                else f"{self.label}: timeout in {left:.0f}s: no rank handles {self.sig_name}, "
                "so none was sent"
            )
        if self.fired:
            return
        if self._warned_stop or self.clock.expired(now):
            self.fired = True
            assert self.timeout is not None  # end and the warning come from the timeout
            self.notes.append(
                f"{self.label}: timeout ({float(self.timeout):g}s): stopping the ranks"
            )
            self.agent.teardown()

    @property
    def timed_out(self) -> bool:
        """The timeout ended this node's processes (or the warning did, see above)."""
        return self.fired or self._warned_stop

    def stopped(self, p: Proc) -> bool:
        if self.warned and p.returncode == -self.sig:
            self._warned_stop = True
            return True
        return False


def setup_environ() -> bool:
    """Over ssh: this process's environment becomes the one the session's shell had
    after ssh.setup, read (NUL-separated, `env -0`) from the fd it names: what started
    this interpreter may have changed it (a pyenv shim prepends its versions' folders to
    PATH, and its PYENV_VERSION), and the ranks must find what setup made (its venv's
    python3 and tools). Nothing read (no `env -0` on the host): left as it is. Whether
    the environment was restored."""
    fd_text = os.environ.pop(SETUP_ENV_VAR, "")
    if not fd_text.isdigit():
        return False
    data = bytearray()
    with contextlib.suppress(OSError):
        fd = int(fd_text)
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
        os.close(fd)
    made: dict[bytes, bytes] = {}
    for item in bytes(data).split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key and key != SETUP_ENV_VAR.encode():
            made[key] = value
    if b"PATH" not in made:
        return False
    for key in [k for k in os.environb if k not in made]:
        del os.environb[key]
    os.environb.update(made)
    return True


def elapsed_before() -> float:
    """The attempt's seconds before this agent started, as the ssh session's script says
    (TREB_ATTEMPT_ELAPSED before the session, then the host's uptime since it began:
    ssh.setup); 0 elsewhere. Taken out of the environment: the ranks do not need them."""
    before = os.environ.pop("TREB_ATTEMPT_ELAPSED", "")
    began = os.environ.pop("TREB_SESSION_UPTIME", "")
    total = 0.0
    with contextlib.suppress(ValueError):
        total += max(0.0, float(before))
    if began:
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/uptime") as fh:
            total += max(0.0, float(fh.read().split()[0]) - float(began))
    return total


def end_strays(run_id: str, node: int, tree: bool = False) -> list[int]:
    """SIGKILL to what this node's processes left behind. `tree` (the agent is a child
    subreaper whose ranks run in sessions of their own: a parked Slurm agent): what is
    left in the agent's own process tree (procs.left_in_tree), linear in its processes,
    however many nodes share the machine's /proc, and found even with its environment
    cleared; the adopted orphans are reaped. Else (no subreaper, or over ssh, where the
    engine never made the agent one) every process that carries the run's TREB_RUN_ID and
    this NODE_RANK (procs.processes_of_run), but this agent and its ancestors (the session
    that started it): an orphan went to init, out of the tree. Returns their pids."""
    me = os.getpid()
    if not tree:
        found = procs.processes_of_run(run_id, {me, *procs.ancestors(me)}, node=node)
        for pid in found:
            procs.signal_pid(pid, signal.SIGKILL)
        return found
    killed: list[int] = []
    deadline = time.monotonic() + STRAYS_S
    while True:  # until nothing is left, not a fixed count of passes: what a leftover
        # forked before its kill, or a child whose parent exited behind the walk (a daemon
        # that forks and exits over and over), is re-parented to us and found next pass
        left = procs.left_in_tree(me)
        live = [pid for pid in left if not procs.zombie(pid)]
        for pid in live:
            procs.signal_pid(pid, signal.SIGKILL)
        wait = max(0.0, deadline - time.monotonic())
        procs.reap(left, timeout=min(1.0 if live else 0.01, wait))  # only our children: the
        killed += sorted(set(live) - set(killed))  # others come back as ours
        if not left or not wait:
            break
    return killed


def session_stdin(gate: barrier.Gate) -> str | None:
    """TREB_NODE_STDIN=1 (the ssh engine): read the secrets' line, then watch stdin in a
    thread: the controller's GO line opens `gate` (barrier.py); nodeloss.INTERRUPT (Ctrl+C on
    the controller) sends this process SIGINT (the agent then stops its ranks as torchrun
    does, SIGINT first); the end of stdin sends it SIGTERM (and closes the gate: no rank
    starts), unless an interrupt came first. Why not wait for SIGHUP: without a terminal,
    sshd sends none when the connection goes. Returns why stdin is unusable."""
    if os.environ.get("TREB_NODE_STDIN") != "1":
        return None
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: nothing read ahead of the line
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    try:
        values = json.loads(line or b"{}")
    except ValueError:
        return "the first line of stdin is not the secrets' JSON object"
    if not isinstance(values, dict):
        return "the first line of stdin is not the secrets' JSON object"
    os.environ.update({str(k): str(v) for k, v in values.items()})

    def watch() -> None:  # the raw fd: a buffered reader's lock would block the exit
        said = b""
        interrupted = False
        with contextlib.suppress(OSError):
            while True:
                chunk = os.read(0, 4096)
                if not chunk:
                    break
                if nodeloss.INTERRUPT in chunk and not interrupted:  # Ctrl+C on the controller
                    interrupted = True
                    os.kill(os.getpid(), signal.SIGINT)  # the agent: SIGINT, TERM, KILL
                said = (said + chunk)[-64:]
                if f"\n{barrier.GO}\n".encode() in b"\n" + said:
                    gate.say(True)
        gate.say(False)
        if not interrupted:  # after an interrupt the agent's own schedule ends the ranks
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="treb-session", daemon=True).start()
    return None


def node(job: JobFile) -> int:
    """Run this node's processes to their end (the verb's docstring, above); over ssh, the
    agent's last word on the session's stdout says it ended (nodeloss.ENDED): a session
    that ends without it lost its node."""
    code = 1
    early = nodeloss.EarlyBeat() if os.environ.get("TREB_NODE_STDIN") == "1" else None
    try:
        code = _node(job, early)
        return code
    except KeyboardInterrupt:  # an interrupt before the agent took its signals: no rank ran
        code = 130
        return code
    finally:
        if early is not None:
            early.stop()
            with contextlib.suppress(OSError):
                os.write(1, f"{nodeloss.ENDED} {code}\n".encode())


def _node(job: JobFile, early: nodeloss.EarlyBeat | None = None) -> int:
    over_ssh = os.environ.get("TREB_NODE_STDIN") == "1"
    setup_environ()
    elapsed = elapsed_before()
    gate = barrier.Gate()
    why = session_stdin(gate) or missing_placement(dict(os.environ))
    if why:
        say(f"node: {why}")
        return 2
    absent = [s for s in job.get("secrets", []) if s not in os.environ]
    if absent:
        say(f"node: secret {', '.join(absent)} not in this node's environment (the engine "
            "passes secrets by name: SkyPilot --secret, a Kubernetes Secret)")  # fmt: skip
        return 2
    n, nnodes = int(os.environ["NODE_RANK"]), int(os.environ["NUM_NODES"])
    attempt = int(os.environ.get("TREB_ATTEMPT") or 0)
    run_dir = os.path.abspath(os.path.expanduser(os.environ["TREB_RUN_DIR"]))
    adir = os.path.join(run_dir, f"attempt-{attempt}")
    os.makedirs(adir, mode=0o700, exist_ok=True)
    if job.get("metrics"):  # the run directory is the node's own here (metrics.hook reads it)
        write_json(os.path.join(run_dir, metrics.CONFIG_FILE), job["metrics"])
    env = node_env(job, run_dir, n, nnodes)
    with contextlib.suppress(OSError):  # the spec's own folder: the ranks will say why
        os.makedirs(env["TREB_CHECKPOINT_DIR"], exist_ok=True)
    where = health.Where(run_dir, adir, attempt, n, os.uname().nodename, os.getcwd(), env)
    unhealthy = health.gate(where, job)  # before any rank: none starts on a sick node
    if unhealthy is not None:
        say(unhealthy)
        return 1
    procs, streams = node_procs(job, env, adir, n, nnodes)
    limit = Limit(job, f"node {n}", elapsed)
    notes = limit.notes

    def on_failure(p: Proc) -> None:
        what = f"rank {p.rank} ({p.label})" if p.rank is not None else f"node {p.label}"
        notes.append(
            f"{what} failed (exit code {p.exit_code}): stopping the others; "
            f"its log: {os.path.join(adir, p.name + '.log')}"
        )

    agent = Agent(
        procs,
        adir,
        os.getcwd(),
        float(job["grace"]),
        forward_term=True,
        extra={"host": os.uname().nodename, "attempt": attempt},
        on_failure=on_failure,
        stopped_elsewhere=limit.stopped,
    )
    limit.agent = agent
    watch = node_hang_watch(job, adir, n)
    hung: list[Hang] = []
    stop_at: list[float] = []  # on_hang retry: the teardown, after the grace period

    def tick() -> None:
        limit.tick()
        if stop_at and time.monotonic() >= stop_at[0]:
            stop_at.clear()
            agent.teardown()
        found = watch.step() if watch is not None and not hung else None
        if found is not None:
            action = found["action"]
            notes.append(f"node {n}: {hang.describe(found)}; on_hang: {action}")
            if action == "warn":
                return
            hung.append(found)
            sig = getattr(signal, job.get("checkpoint_signal") or "SIGUSR2")
            if action == "retry" and agent.signal_all(sig):
                # the handlers get the grace period to checkpoint (as the local supervisor
                # and the Slurm controller do): a SIGTERM now could end a rank first
                stop_at.append(time.monotonic() + float(job["grace"]))
            else:
                agent.teardown()

    agent.install_signals()
    if over_ssh:  # every node's checks end before any rank starts (barrier.py)
        os.write(1, f"{barrier.HEALTHY}\n".encode())
        if not gate.wait(agent.stop_requested):
            return 128 + signal.SIGTERM  # stopped before its ranks: none started
    beat = (f"{nodeloss.BEAT}\n".encode(), nodeloss.BEAT_S) if over_ssh else None
    if early is not None:  # the log copy's thread beats from now on
        early.stop()
    copy = LogCopy(streams, notes=notes, beat=beat).start()
    rc = agent.run(tick)
    if over_ssh:  # the host's own: nothing else would end them
        left = end_strays(os.environ["TREB_RUN_ID"], n)
        if left:
            notes.append(f"node {n}: {len(left)} process(es) the ranks left behind were "
                         f"killed (pids {', '.join(map(str, left[:10]))})")  # fmt: skip
    if not copy.finish():
        say(f"the copy of the ranks' logs here was cut short; they are whole in {adir}")
    if limit.timed_out and agent.first_failure is None:
        return TIMEOUT_EXIT
    if hung and agent.first_failure is None:
        return HANG_EXIT
    return rc


def node_hang_watch(job: JobFile, adir: str, node: int) -> hang.HangWatch | None:
    """This node's hang watch: the run directory is the node's own on these engines, so
    the node decides for its ranks (hung when none of them progressed: docs/hangs.md)."""
    if not job.get("hang_timeout"):
        return None
    ppn = int(job["ppn"])
    names = (
        [f"node-{node}"]
        if job["launcher"] == "none"
        else [f"rank-{node * ppn + local}" for local in range(ppn)]
    )
    return hang.HangWatch(adir, float(job["hang_timeout"]), job.get("on_hang") or "fail", names)
