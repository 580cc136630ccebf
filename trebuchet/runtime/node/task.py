"""What one srun task, one torchrun/mpirun worker or one pre/post command runs: an Agent
around its process(es), with the rank contract filled from what started it.

Where the engine starts each rank itself (srun-native, mpirun), the agent runs per task
around its one rank, so Slurm's CPU/GPU binding and PMIx keep working (seed 004's
srun-native mode); under torchrun and `none` it runs once per node around the node's
launcher, and torchrun's workers each run `worker` around their rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from ..contracts import rank_env as contract
from ..job import link as agent_link
from ..process import procs
from ..rundir.records import attempt_records, sync, write_bytes, write_text
from ..rundir.regular import open_regular
from . import barrier, health
from .agent import STOP_EXIT_CODES, Agent, Proc

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..contracts.schema import JobFile

NO_PYTHON = (  # a clear line, and exit 127, where a node (or its image) lacks python3
    'command -v python3 >/dev/null 2>&1 || { echo "treb: no python3 (>= 3.8) on '
    '$(hostname): the node agent needs it (in the container image too)" >&2; exit 127; }'
)
PLACEMENT_ENV = "TREB_PLACEMENT"  # a spare's step: the attempt's node ranks (place)
PYTHON_GUARD = NO_PYTHON + '; exec python3 -S "$@"'  # the first words of every srun step


def self_argv() -> list[str]:
    """How to start this runtime again on this node (workers under torchrun/mpirun)."""
    root = os.path.abspath(__file__)
    for _ in __name__.split("."):  # up to the sys.path entry that holds the package
        root = os.path.dirname(root)
    if os.path.isfile(root):  # inside the .pyz: the sys.path entry is the file
        return [sys.executable, "-S", root]
    return [sys.executable, "-m", "trebuchet.runtime"]


def _int_env(name: str, default: int = 0) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def _slurm_extra(attempt: int) -> dict[str, Any]:
    return {
        "host": os.uname().nodename,
        "attempt": attempt,
        "job_id": os.environ.get("SLURM_JOB_ID", ""),
        "step_id": os.environ.get("SLURM_STEP_ID", ""),
    }


def _attempt_dir(job: JobFile) -> tuple[int, str]:
    attempt = _int_env("TREB_ATTEMPT")
    return attempt, os.path.join(job["run_dir"], f"attempt-{attempt}")


def slurm_stopped_elsewhere(run_dir: str, adir: str) -> Callable[[Proc], bool]:
    """Slurm signals a step's processes one by one (children first with proctrack/linuxproc):
    a command can die of the step's TERM before its agent's own TERM arrives. Such a death is
    a stop, not a failure, when a cancel or a teardown is on record or the job is ending."""

    def check(p: Proc) -> bool:
        if p.exit_code not in STOP_EXIT_CODES:
            return False
        if os.path.exists(os.path.join(run_dir, "cancel-requested")):
            return True
        if os.path.exists(os.path.join(adir, "teardown")):
            return True
        try:
            res = subprocess.run(
                ["squeue", "-h", "-j", os.environ.get("SLURM_JOB_ID", ""), "-o", "%T"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        state = res.stdout.strip()
        return res.returncode == 0 and bool(state) and state != "RUNNING"

    return check


def slurm_teardown(adir: str, label: str) -> None:
    """The first failure stops the other tasks of this step: a marker (for the tasks whose
    command dies before their own TERM arrives), then TERM to the whole step; each agent
    sends SIGKILL after the grace period (srun would otherwise wait for them forever)."""
    write_text(os.path.join(adir, "teardown"), label + "\n")
    step = f"{os.environ.get('SLURM_JOB_ID', '')}.{os.environ.get('SLURM_STEP_ID', '')}"
    ignore_term = lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)  # noqa: E731
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            ["scancel", "--signal=TERM", step],
            stderr=subprocess.DEVNULL,
            preexec_fn=ignore_term,
            timeout=60,
        )


def slurm_task(job: JobFile) -> int:
    """One task of the ranks' srun step, on the line to its controller (agent_link: its
    heartbeat while it runs, its end once its records are written). Where the controller
    keeps the step (agent_link.PARK_ENV), the agent then waits for its word and runs the
    next attempt's ranks in the same step (a retry without a new srun step: issue 36)."""
    # the step's id too: a lost node's spare runs in a step of its own beside the parked
    # agents' step, and both steps' first task is SLURM_PROCID 0
    task = f"{os.environ.get('SLURM_STEP_ID', '?')}.{os.environ.get('SLURM_PROCID', '?')}"
    place(os.environ.pop(PLACEMENT_ENV, ""))  # a spare's step: this node's place
    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename  # Slurm's name for it
    attempt = _int_env("TREB_ATTEMPT")
    timeout = float(job.get("node_timeout") or agent_link.NODE_TIMEOUT_S)
    park = os.environ.pop(agent_link.PARK_ENV, "") == "1"  # not the ranks' business

    def controller_lost(heard: float) -> None:  # Slurm's batch host died (batchloss.py)
        from ..job import batchloss

        batchloss.on_lost(job, attempt, timeout, heard)

    link = agent_link.open_link(attempt, task, host, controller_lost, timeout)
    # A parked agent ends its ranks' leftovers itself (below): as their subreaper, it finds
    # them in its own tree (however many nodes share this /proc, whatever their environ)
    tree = park and link is not None and procs.become_subreaper()
    while True:
        code, healthy, unsynced = slurm_attempt(job, link if park else None)
        if link is None or not park or not healthy or link.sock is None:
            sync(unsynced)  # durable before its last word
            break
        link.park(code)  # the attempt's end (its records are written), then the next word
        # While the controller decides (a retry's critical path, issue 36): the records made
        # durable, and what the ranks left behind (a daemon out of their process group),
        # which would outlive the attempt in a step that goes on, ended as the step's end
        # would have. Both before the next word is read: no next rank meets a leftover.
        from .per_node import end_strays

        sync(unsynced)
        end_strays(str(job["run_id"]), _int_env("SLURM_NODEID"), tree=tree)
        following = link.wait_next(lambda: False)  # a TERM now is Slurm's: its KILL follows
        if following is None:
            link.close()
            return code
        attempt = following
        os.environ["TREB_ATTEMPT"] = str(attempt)
        if link.placement is not None:  # the nodes changed (a lost node's spare)
            node, nodes, master, port, step_nodes, job_nodes = link.placement
            os.environ.update(MASTER_ADDR=master, MASTER_PORT=port)
            slurm_place(node, nodes, step_nodes, job_nodes)
        link.next_attempt(attempt)
    if link is not None:
        link.ended(code)
    return code


def place(value: str) -> None:
    """A spare's step (Controller.spare_step): `<nodes>;<host>=<node rank>,...;<attempt's
    nodes>;<job's nodes>`, each task's node rank in the attempt, not in its step of one or
    a few nodes; its step's environment has the attempt's master already. Malformed or not
    this host's: as is."""
    nodes, ranks, step_nodes, job_nodes = [*value.split(";"), "", "", ""][:4]
    host = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    mine = [r for h, _, r in (p.partition("=") for p in ranks.split(",")) if h == host]
    if nodes.isdigit() and len(mine) == 1 and mine[0].isdigit() and int(mine[0]) < int(nodes):
        slurm_place(int(mine[0]), int(nodes), step_nodes, job_nodes)


def slurm_place(node: int, nodes: int, step_nodes: str, job_nodes: str) -> None:
    """This node's place in an attempt after a lost node, in the Slurm variables its ranks
    inherit, alike on a parked survivor (whose step began with the lost node) and on a
    spare (whose step holds the spares alone): its node id and count, and where the
    controller said them, the attempt's nodes as the step's node list, and the job's
    (SLURM_NODELIST is Slurm's older name of SLURM_JOB_NODELIST)."""
    os.environ.update(SLURM_NODEID=str(node), SLURM_NNODES=str(nodes),
                      SLURM_STEP_NUM_NODES=str(nodes))  # fmt: skip
    if step_nodes:
        os.environ["SLURM_STEP_NODELIST"] = step_nodes
    if job_nodes:
        os.environ.update(SLURM_JOB_NODELIST=job_nodes, SLURM_NODELIST=job_nodes)
        with contextlib.suppress(Exception):  # python-hostlist's BadHostlist, ValueError
            os.environ["SLURM_JOB_NUM_NODES"] = str(len(contract.expand_hostlist(job_nodes)))


def slurm_attempt(job: JobFile, link: agent_link.Link | None) -> tuple[int, bool, list[str]]:
    """This task's part of one attempt (TREB_ATTEMPT): its node's checks, the barrier, its
    ranks to their end. Its exit code, whether its node was healthy, and the records it
    wrote that are not yet durable (the caller syncs them: a parked agent after its word
    to the controller). With a `link` (a step the controller keeps: its agents stop their
    ranks themselves) a failure is said on it and the controller's `stop` stops this
    node's ranks, without scancel."""
    agent = slurm_agent(job, link=link)
    agent.install_signals()
    agent.defer_sync = True  # the caller's (take_unsynced below)
    if link is not None:
        link.on_stop = lambda: link_stop(agent)
        if link.stop_said:  # came before the hook: the attempt is already over
            link_stop(agent)
    # A task that srun starts after the attempt's teardown (its TERM went to the tasks
    # already there) must not start its rank: nobody would stop it.
    torn_down = os.path.exists(os.path.join(_attempt_dir(job)[1], "teardown"))
    unhealthy = None if torn_down else health.slurm_gate(job)  # before any rank starts
    if unhealthy is not None:  # no rank here; the other nodes' ranks are stopped
        print(f"[treb] {unhealthy}", file=sys.stderr, flush=True)
        if _int_env("SLURM_LOCALID") == 0:
            slurm_teardown(_attempt_dir(job)[1], health.LABEL)
    elif not torn_down:  # every node's checks end before any rank starts (barrier.py)
        torn_down = not slurm_go(job, link, agent)
    code = 128 + signal.SIGTERM if torn_down else 1 if unhealthy else agent.run()
    if link is not None:
        link.on_stop = None
    return code, unhealthy is None, agent.take_unsynced()


def link_stop(agent: Agent) -> None:
    """The controller's `stop` over the link (another node's rank failed): the agent's
    teardown, as on Slurm's TERM, but with the agent signalling its ranks itself (no
    scancel reached them): SIGTERM, the grace period, SIGKILL."""
    agent.forward_term = True
    os.kill(os.getpid(), signal.SIGTERM)


def slurm_failed(adir: str, label: str, link: agent_link.Link | None, agent: Agent) -> None:
    """A rank of this node failed first: the teardown marker, then the others stopped:
    over the link by the controller where the step is kept (the agent then stops its own
    ranks, SIGTERM to their groups), else by scancel (slurm_teardown)."""
    if link is not None:
        write_text(os.path.join(adir, "teardown"), label + "\n")  # before any stop
        if link.failed():
            agent.forward_term = True  # no scancel signals this node's ranks: the agent does
            return
    slurm_teardown(adir, label)


def slurm_go(job: JobFile, link: agent_link.Link | None, agent: Agent) -> bool:
    """This task's node is healthy: say so to the controller and wait for its go, given
    once every task of the step said it (barrier.py). False: stopped meanwhile (an
    unhealthy node's teardown, a cancel), the rank must not start."""
    attempt, adir = _attempt_dir(job)
    said = link is not None and link.healthy()

    def linked() -> bool:
        return said and link is not None and link.sock is not None

    def go(wait: float) -> bool | None:
        if not linked() or link is None:
            time.sleep(wait)
            return None
        return link.wait_go(wait)

    return barrier.slurm_wait(go, adir, attempt, _int_env("SLURM_NNODES", 1),
                              agent.stop_requested, lambda: not linked())  # fmt: skip


def slurm_agent(job: JobFile, inline: bool = False,
                link: agent_link.Link | None = None) -> Agent:  # fmt: skip
    """The agent of one Slurm task. `inline`: the job's only task, run by the controller in
    the batch step itself (no srun step, see controller.py): nothing else to stop on a
    failure, and the controller handles the signals."""
    launcher, ppn = job["launcher"], int(job["ppn"])
    attempt, adir = _attempt_dir(job)
    node, nnodes = _int_env("SLURM_NODEID"), _int_env("SLURM_NNODES", 1)
    env = dict(os.environ)
    env.update(contract.node_vars(node, nnodes))
    if launcher != "none" and not env.get("OMP_NUM_THREADS"):
        cpus = _int_env("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1
        env["OMP_NUM_THREADS"] = contract.omp_threads(cpus, ppn)
    cmd = list(job["command"])
    worker = [*self_argv(), "worker", "--slurm", "--grace", str(job["grace"])]
    if launcher == "native" and node_agent(job):  # this node's ranks, as srun would
        ranks = [(node * ppn + local, local) for local in range(ppn)]
        procs = native_procs(job, env, node, nnodes, ranks, None, slurm_tasks=True)
    elif launcher == "native":  # srun started this rank as a task of its own (slurm.mpi)
        ranks = [(_int_env("SLURM_PROCID"), _int_env("SLURM_LOCALID"))]
        procs = native_procs(job, env, node, nnodes, ranks, None)
    elif launcher == "torchrun":
        procs = [torchrun_proc(env, node, nnodes, ppn, worker, cmd)]
    elif launcher in ("mpirun", "horovod"):  # horovod: under mpirun (runtime/node/horovodrun.py)
        argv = _mpirun_argv(job, env, worker, cmd)
        procs = [Proc(f"node-{node}", str(node), argv, env, node=node, launcher=True)]
    else:  # none: the user's own launcher, once per node
        procs = [none_proc(env, node, ppn, cmd)]
    agent = Agent(
        procs,
        adir,
        job["workdir"],
        float(job["grace"]),
        forward_term=False,
        engine_delivers_checkpoint=True,
        extra=_slurm_extra(attempt),
        on_failure=None if inline else lambda p: slurm_failed(adir, p.label, link, agent),
        stopped_elsewhere=slurm_stopped_elsewhere(job["run_dir"], adir),
    )
    return agent


def node_agent(job: JobFile) -> bool:
    """Whether each task of the ranks' srun step is its node's agent, which starts all the
    node's ranks (one task per node: issue 36), rather than one rank's (srun starts each
    rank under `slurm.mpi`): as the step's own --ntasks-per-node says (backends/slurm)."""
    per_task = [a for a in job.get("srun") or [] if a.startswith("--ntasks-per-node=")]
    return bool(per_task) and per_task[0] == "--ntasks-per-node=1"


def native_procs(job: JobFile, env: dict[str, str], node: int, nnodes: int,
                 ranks: list[tuple[int, int]], elastic_id: str | None,
                 slurm_tasks: bool = False) -> list[Proc]:  # fmt: skip
    """launcher native: a process per (rank, local rank) with the rank contract, on every
    engine's node agent. `elastic_id`: TORCHELASTIC_RUN_ID, None where srun's variables
    say who the launcher is (Slurm: Lightning would otherwise take torchrun for it and drop
    its SLURM auto-requeue); `slurm_tasks`: each rank also gets the SLURM_* variables of
    the task srun would have started for it (contract.slurm_task_vars)."""
    ppn, cmd = int(job["ppn"]), list(job["command"])
    out = []
    for rank, local in ranks:
        renv = dict(env)
        renv.update(contract.rank_vars(rank, local, node, nnodes, ppn))
        renv.update(contract.elastic_vars(elastic_id, int(job.get("max_attempts", 1)) - 1))
        if slurm_tasks:
            renv.update(contract.slurm_task_vars(rank, local, node, nnodes, ppn))
        out.append(Proc(f"rank-{rank}", f"{node}:{local}", cmd, renv, rank, node, local))
    return out


def torchrun_proc(
    env: dict[str, str], node: int, nnodes: int, ppn: int, worker: list[str], cmd: list[str]
) -> Proc:
    """A node's torchrun; each of its workers runs `worker` around its rank."""
    argv = [
        "torchrun",
        "--nnodes",
        str(nnodes),
        "--node_rank",
        str(node),
        "--nproc_per_node",
        str(ppn),
        "--master_addr",
        env["MASTER_ADDR"],
        "--master_port",
        env["MASTER_PORT"],
        *(["--rdzv-id", env["TREB_RUN_ID"]] if env.get("TREB_RUN_ID") else []),
        "--no-python",
        *worker,
        "--",
        *cmd,
    ]
    return Proc(f"node-{node}", str(node), argv, env, node=node, launcher=True)


def none_proc(env: dict[str, str], node: int, ppn: int, cmd: list[str]) -> Proc:
    """launcher none: the user's own command once per node, told how many ranks to start."""
    env["LOCAL_WORLD_SIZE"] = str(ppn)
    return Proc(f"node-{node}", str(node), cmd, env, node=node)


def _mpirun_argv(job: JobFile, env: dict[str, str], worker: list[str], cmd: list[str]) -> list[str]:
    """mpirun from the one task on the first node; OpenMPI starts its daemons on the others
    through Slurm (a step of this job) and every rank runs `worker --mpi` around itself."""
    ppn, nodes = int(job["ppn"]), _int_env("SLURM_JOB_NUM_NODES", 1)
    env["NUM_NODES"], env["LOCAL_WORLD_SIZE"] = str(nodes), str(ppn)
    # OpenMPI reads the allocation from these: this one-task step's values would give it one
    # slot on one node. With the job's, it sees ppn slots on every node.
    env["SLURM_NODELIST"] = env.get("SLURM_JOB_NODELIST", "")
    env["SLURM_TASKS_PER_NODE"] = f"{ppn}(x{nodes})"
    hosts = contract.expand_hostlist(env["SLURM_NODELIST"]) if env["SLURM_NODELIST"] else []
    if os.geteuid() == 0:  # OpenMPI refuses root otherwise
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    names = [
        "PATH",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NUM_NODES",
        "LOCAL_WORLD_SIZE",
        "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED",
        "TREB_RUN_ID",
        "TREB_RUN_DIR",
        "TREB_WORKDIR",
        "TREB_CODE_DIR",
        "TREB_CHECKPOINT_DIR",
        "TREB_ATTEMPT",
        *job.get("mpi_env", []),
    ]
    xs: list[str] = []
    for name in dict.fromkeys(names):  # mpirun passes variables to remote ranks only with -x
        if name in env:
            xs += ["-x", name]
    # When a rank fails, OpenMPI sends SIGTERM to the others, then SIGKILL after
    # odls_base_sigkill_timeout (1 s by default): the grace period instead, so that each
    # worker has the time to record its rank as stopped by the launcher.
    return [
        "mpirun",
        "-np",
        str(nodes * ppn),
        "-H",
        ",".join(f"{h}:{ppn}" for h in hosts),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--mca",
        "odls_base_sigkill_timeout",
        str(max(1, int(float(job["grace"])))),
        *xs,
        *worker,
        "--mpi",
        str(ppn),
        "--",
        *cmd,
    ]


def slurm_hook(job: JobFile, when: str) -> int:
    """The spec's pre/post command on this node (one task per node)."""
    attempt, adir = _attempt_dir(job)
    node, nnodes = _int_env("SLURM_NODEID"), _int_env("SLURM_NNODES", 1)
    env = dict(os.environ)
    env.update(contract.node_vars(node, nnodes), LOCAL_WORLD_SIZE=str(job["ppn"]))
    proc = Proc(
        f"{when}-node-{node}",
        f"{when}:{node}",
        ["bash", "-c", job["pre" if when == "pre" else "post"]],
        env,
        node=node,
        record=False,
    )
    agent = Agent(
        [proc],
        adir,
        job["workdir"],
        float(job["grace"]),
        forward_term=False,
        engine_delivers_checkpoint=True,
    )
    agent.install_signals()
    return agent.run()


def worker(args: list[str]) -> int:
    """One rank that torchrun, mpirun or horovodrun started: its own log and record.

    `worker [--slurm] [--grace S] [--mpi PPN] -- COMMAND...` (--slurm: Slurm delivers the
    checkpoint signal to every process of the step, and a stop of the step is no failure)"""
    on_slurm, grace, mpi_ppn = False, 5.0, 0
    while args and args[0] != "--":
        opt = args.pop(0)
        if opt == "--slurm":
            on_slurm = True
        elif opt == "--grace":
            grace = float(args.pop(0))
        elif opt == "--mpi":
            mpi_ppn = int(args.pop(0))
        else:
            sys.stderr.write(f"treb-runtime worker: unknown option {opt}\n")
            return 2
    cmd = args[1:]
    env = dict(os.environ)
    if mpi_ppn:
        env.update(contract.mpi_rank_vars(env, mpi_ppn))
        if env.get("TREB_HOROVOD_PICK_IFACE"):  # gloo across hosts: this host's interface
            from .horovodrun import pick_iface

            pick_iface(env)
        masks = env.get("TREB_NODE_GPUS")  # simulated nodes: each picks its node's devices
        if masks:
            node_mask = masks.split(";")[int(env["NODE_RANK"])]
            for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
                if name in env:
                    env[name] = node_mask
    missing = [
        n
        for n in ("RANK", "LOCAL_RANK", "TREB_RUN_DIR")
        if not env.get(n, "").isdigit() and (n != "TREB_RUN_DIR" or not env.get(n))
    ]
    if missing:
        sys.stderr.write(
            f"treb-runtime worker: {', '.join(missing)} not set: a worker runs "
            "under torchrun, mpirun or horovodrun started by trebuchet\n"
        )
        return 2
    rank, local = int(env["RANK"]), int(env["LOCAL_RANK"])
    node = int(env.get("GROUP_RANK") or env.get("NODE_RANK") or 0)
    attempt = _int_env("TREB_ATTEMPT")
    adir = os.path.join(env["TREB_RUN_DIR"], f"attempt-{attempt}")
    proc = Proc(f"rank-{rank}", f"{node}:{local}", cmd, env, rank, node, local)
    extra = _slurm_extra(attempt) if on_slurm else {}
    cwd = env.get("TREB_WORKDIR") or os.getcwd()
    elsewhere = slurm_stopped_elsewhere(env["TREB_RUN_DIR"], adir) if on_slurm else None
    if mpi_ppn:  # horovod: a rank that failed because another one did is a cascade
        elsewhere = _horovod_cascade(adir, elsewhere)
    # The launcher stops its workers (TERM) when one fails: a cascade, not a cause.
    agent = Agent(
        [proc],
        adir,
        cwd,
        grace,
        forward_term=True,
        engine_delivers_checkpoint=on_slurm,
        extra=extra,
        stopped_elsewhere=elsewhere,
    )
    agent.install_signals()
    theirs = env.get("TORCHELASTIC_ERROR_FILE")  # torchrun's path: the agent sets ours
    code = agent.run()
    hand_error_file(contract.error_file(adir, proc.name), theirs)
    return code


def _horovod_cascade(adir: str, other: Callable[[Proc], bool] | None) -> Callable[[Proc], bool]:
    """stopped_elsewhere for a rank under mpirun/horovodrun: also when its log ends with
    horovod's shutdown after another rank's failure (runtime/node/horovodrun.py)."""
    from .horovodrun import peer_shutdown

    def stopped(p: Proc) -> bool:
        if other is not None and other(p):
            return True
        p.after_peer = peer_shutdown(os.path.join(adir, p.name + ".log"))
        return p.after_peer

    return stopped


def hand_error_file(ours: str, theirs: str | None) -> None:
    """A torchrun worker's @record error file, written where treb reads it, copied to the
    path torchrun gave the worker, so that torchrun's own failure report quotes it too."""
    if not theirs or theirs == ours:
        return
    with contextlib.suppress(OSError):
        with open_regular(ours) as src:  # a FIFO the rank left there never blocks
            data = src.read(1 << 20)
        write_bytes(theirs, data, durable=False)


def _step_agent(pid: int, run: str) -> list[int]:
    """The agent that started `pid` when it is a step's own task (its parent is no process
    of the run: slurmstepd), as a list; [] under a worker agent (torchrun's, mpirun's),
    which gets the interrupt from its launcher, as torchrun hands Ctrl+C on."""
    up = procs.ancestors(pid)[:2]
    if len(up) == 2 and procs.in_run(up[0], run) and not procs.in_run(up[1], run):
        return [up[0]]
    return []


def deliver(job: JobFile, sig_name: str) -> int:
    """The `signal` verb, one task per node of the job (the controller's step at the time
    limit warning): the checkpoint signal to this node's running commands of this attempt
    (their records give the pids), each to the processes that handle it, by the rule of
    Agent.signal_all. `scancel --signal` would reach every process of the step instead."""
    attempt, adir = _attempt_dir(job)
    host, sig = os.uname().nodename, int(getattr(signal, sig_name))
    run = str(job["run_id"])
    sent: list[int] = []
    for rec in attempt_records(adir):
        pid = rec.get("pid")
        if not isinstance(pid, int) or rec.get("state") != "RUNNING" or rec.get("host") != host:
            continue
        if not procs.in_run(pid, run):
            continue  # ended, and the pid reused
        if sig == signal.SIGINT:  # Ctrl+C: to the step's agents, which hand it on once
            sent += [a for a in _step_agent(pid, run) if a not in sent and procs.signal_pid(a, sig)]
        else:
            sent += [p for p in procs.catchers(pid, sig) if procs.signal_pid(p, sig)]
    print(f"[treb] {host}: {sig_name} to {len(sent)} process(es) that handle it", flush=True)
    return 0
