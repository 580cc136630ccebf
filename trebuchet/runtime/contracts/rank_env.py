"""The rank contract, defined once: which variables a rank gets, and how they are derived
from whatever started it (trebuchet's agent, torchrun, srun, mpirun, SkyPilot).

Why one module: the local plan, the node agent on every engine, the MPI workers and
`trebuchet.dist.init_env()` all need the same names and the same formulas (master port,
OMP threads, node of an MPI rank); written once here, they cannot drift.

Stdlib only and Python >= 3.8: it is part of the runtime that every run carries to its
nodes (trebuchet/runtime), and `init_env()` runs in user code before torch is imported.
"""

from __future__ import annotations

import os
import re
import subprocess

__all__ = [
    "expand_hostlist",
    "init_env",
    "slurm_master_port",
    "rank_vars",
    "node_vars",
    "elastic_vars",
    "slurm_task_vars",
]

DEFAULT_MASTER_PORT = 29500  # torch's own default, for engines that do not give us a job id
# Names trebuchet itself sets in a rank (the spec's env may not set them, except MASTER_*).
RANK_NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
NODE_NAMES = ("NODE_RANK", "GROUP_RANK", "NUM_NODES")


def rank_vars(rank: int, local_rank: int, node: int, nodes: int, ppn: int) -> dict[str, str]:
    """Everything that says where one rank is, as launcher native sets it (torchrun's names
    too: GROUP_*, ROLE_*)."""
    world = nodes * ppn
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(ppn),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        **node_vars(node, nodes),
    }


def slurm_task_vars(rank: int, local_rank: int, node: int, nodes: int, ppn: int) -> dict[str, str]:
    """What srun tells a task about itself and its step, for a rank that the node's agent
    started (one srun task per node): as srun would have, had it started the rank as a task
    of its own, so that code which reads them (Lightning's SLURMEnvironment: SLURM_PROCID,
    SLURM_LOCALID, SLURM_NTASKS) finds this rank, not the agent's task."""
    world = nodes * ppn
    per_node = f"{ppn}(x{nodes})" if nodes > 1 else str(ppn)
    first = node * ppn
    return {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_NTASKS": str(world),
        "SLURM_NPROCS": str(world),
        "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_NTASKS_PER_NODE": str(ppn),
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_GTIDS": ",".join(str(first + i) for i in range(ppn)),
    }


# torchrun's own variables for its workers (torch/distributed/elastic/agent/server/
# local_elastic_agent.py, _start_workers), which launcher native gives its ranks too, so
# that torch.distributed.is_torchelastic_launched() and the trainers that test it (Lightning's
# TorchElasticEnvironment) behave as under torchrun, and torch's @record writes its error
# file where the diagnosis reads it. Not TORCHELASTIC_USE_AGENT_STORE: it tells a rank that
# a torchrun agent hosts its store, and init_process_group would wait for that agent.
ELASTIC_ROLE = "default"  # torchrun's --role default
ERRORS_DIR = "errors"  # attempt-<n>/errors/: beside, never among, the outcome records


def elastic_vars(run_id: str | None, max_restarts: int) -> dict[str, str]:
    """What torchrun tells its workers about the whole run: the run id (its --rdzv-id), the
    retry budget (treb's `retries`: treb restarts, not torchrun) and the role.

    run_id None: no TORCHELASTIC_RUN_ID, for ranks that srun starts (Slurm, native): srun is
    their launcher, and with that variable set Lightning would take torchrun for it
    (TorchElasticEnvironment before SLURMEnvironment) and drop its SLURM auto-requeue."""
    out = {"TORCHELASTIC_MAX_RESTARTS": str(max(0, max_restarts)), "ROLE_NAME": ELASTIC_ROLE}
    if run_id:
        out["TORCHELASTIC_RUN_ID"] = run_id
    return out


def error_file(attempt_dir: str, name: str) -> str:
    """Where a rank's structured error goes (torch's @record): `errors/rank-<r>.json` of
    its attempt (the agent creates the folder; torch only opens the file)."""
    return os.path.join(attempt_dir, ERRORS_DIR, name + ".json")


def attempt_elastic_vars(env: dict[str, str], attempt_dir: str, name: str) -> dict[str, str]:
    """The per-attempt part, set by the agent as it starts a rank whose environment carries
    TORCHELASTIC_MAX_RESTARTS (a native rank: elastic_vars; a torchrun worker): its error
    file, the attempt as the restart count (torchrun's own count stays: treb never lets
    torchrun restart, so it is 0), TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless set. {} for any
    other process."""
    if "TORCHELASTIC_MAX_RESTARTS" not in env:
        return {}
    return {
        "TORCHELASTIC_ERROR_FILE": error_file(attempt_dir, name),
        "TORCHELASTIC_RESTART_COUNT": env.get("TORCHELASTIC_RESTART_COUNT")
        or env.get("TREB_ATTEMPT")
        or "0",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") or "1",
    }


def node_vars(node: int, nodes: int) -> dict[str, str]:
    """What a whole node knows (launcher none, a torchrun agent, pre/post commands)."""
    return {"NODE_RANK": str(node), "GROUP_RANK": str(node), "NUM_NODES": str(nodes)}


def omp_threads(cpus: int, ranks: int) -> str:
    """OMP_NUM_THREADS: the node's CPUs split over the ranks that share them (>= 1)."""
    return str(max(1, cpus // max(1, ranks)))


def mpi_rank_vars(environ: dict[str, str], ppn: int) -> dict[str, str]:
    """The contract for a rank that mpirun/horovodrun started (`--map-by slot`: a node's
    slots fill first, so the node is RANK // ppn)."""
    rank = _int(
        environ.get("OMPI_COMM_WORLD_RANK")
        or environ.get("HOROVOD_RANK")
        or environ.get("PMI_RANK")
    )
    size = _int(
        environ.get("OMPI_COMM_WORLD_SIZE")
        or environ.get("HOROVOD_SIZE")
        or environ.get("PMI_SIZE")
    )
    if rank is None or size is None or ppn < 1:
        return {}
    return rank_vars(rank, rank % ppn, rank // ppn, max(1, size // ppn), ppn)


def _get(*names: str) -> str | None:
    """The first of these variables that is set and non-empty."""
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (`nodeA,nodeB[1-3]`) into host names.

    Uses python-hostlist when installed, else `scontrol show hostnames`, else a small
    parser good for the usual `prefix[1-3,07-09]suffix` forms, so that a missing optional
    dependency never leaves MASTER_ADDR unset.
    """
    try:
        import hostlist  # python-hostlist; lazy: only Slurm users need it
    except ImportError:
        pass
    else:
        return list(hostlist.expand_hostlist(expr, allow_duplicates=True))  # as Slurm does
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", expr],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        hosts = out.split()
        if hosts:
            return hosts
    except (OSError, subprocess.SubprocessError):
        pass
    return _expand_builtin(expr)


def _expand_builtin(expr: str) -> list[str]:
    """Fallback expansion: comma-separated items, each with any number of [ranges]."""
    items: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(expr + ","):
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            if expr[start:i].strip():
                items.append(expr[start:i].strip())
            start = i + 1
    hosts: list[str] = []
    for item in items:
        variants = [""]
        for text, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
            choices = [text]
            if ranges:
                choices = []
                for part in ranges.split(","):
                    lo, _, hi = part.partition("-")
                    hi = hi or lo
                    choices += [f"{text}{n:0{len(lo)}d}" for n in range(int(lo), int(hi) + 1)]
            variants = [v + c for v in variants for c in choices]
        hosts += variants
    return hosts


def slurm_master_port(job_id: str) -> int:
    """15000 + the last 4 digits of the job id (Megatron Bridge's convention: 15000-24999).

    Every task of a job derives the same port without talking, and concurrent jobs sharing a
    node rarely collide.
    """
    digits = re.sub(r"\D", "", job_id)
    return 15000 + int(digits[-4:] or 0)


def _tasks_on_node(tasks_per_node: str, node_id: int | None) -> str | None:
    """This node's entry of SLURM_TASKS_PER_NODE (`2(x3),1` means 2,2,2,1)."""
    counts: list[str] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            return None
        counts += [match[1]] * int(match[2] or 1)
    if node_id is not None and 0 <= node_id < len(counts):
        return counts[node_id]
    return counts[0] if counts else None


def _from_slurm() -> dict[str, str | None]:
    node_id = _get("SLURM_NODEID")
    local_world = _get("SLURM_NTASKS_PER_NODE")
    per_node = _get("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if local_world is None and per_node:
        local_world = _tasks_on_node(per_node, _int(node_id))
    nodelist = _get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    job_id = _get("SLURM_JOB_ID", "SLURM_JOBID")
    return {
        "RANK": _get("SLURM_PROCID"),
        "WORLD_SIZE": _get("SLURM_NTASKS", "SLURM_NPROCS"),
        "LOCAL_RANK": _get("SLURM_LOCALID"),
        "LOCAL_WORLD_SIZE": local_world,
        "NODE_RANK": node_id,
        "NUM_NODES": _get("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        "MASTER_ADDR": _first_host(nodelist),
        "MASTER_PORT": str(slurm_master_port(job_id)) if job_id else None,
    }


def _first_host(nodelist: str | None) -> str | None:
    hosts = expand_hostlist(nodelist) if nodelist else []
    return hosts[0] if hosts else None


def _from_mpi(
    rank: str, size: str, local_rank: str | None, local_size: str | None
) -> dict[str, str | None]:
    """Open MPI and MPICH/Intel MPI give ranks but no host list: derive what is safe."""
    values: dict[str, str | None] = {
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_size,
    }
    r, n, ln = _int(rank), _int(size), _int(local_size)
    if r is not None and n and ln and n % ln == 0:  # block mapping, same count per node
        values["NODE_RANK"] = str(r // ln)
        values["NUM_NODES"] = str(n // ln)
        if ln == n:  # a single node: rank 0 is on this one
            values["MASTER_ADDR"] = "127.0.0.1"
    if _get("SLURM_JOB_ID", "SLURM_JOBID"):  # mpirun inside a Slurm allocation
        slurm = _from_slurm()
        values.setdefault("MASTER_ADDR", slurm["MASTER_ADDR"])
        values["MASTER_PORT"] = slurm["MASTER_PORT"]
    values.setdefault("MASTER_PORT", str(DEFAULT_MASTER_PORT))
    return values


def _from_skypilot() -> dict[str, str | None]:
    """SkyPilot runs the command once per node: the node is known, a process rank is not.

    RANK, WORLD_SIZE and LOCAL_RANK are set only with one GPU (or none) per node, where the
    one process per node is the whole world; otherwise LOCAL_WORLD_SIZE says how many
    processes to start per node (like trebuchet's `none` launcher).
    """
    ips = (_get("SKYPILOT_NODE_IPS") or "").split()
    node_rank, num_nodes = _get("SKYPILOT_NODE_RANK"), _get("SKYPILOT_NUM_NODES")
    local_world = str(max(1, _int(_get("SKYPILOT_NUM_GPUS_PER_NODE")) or 1))
    values: dict[str, str | None] = {
        "NODE_RANK": node_rank,
        "NUM_NODES": num_nodes or (str(len(ips)) if ips else None),
        "LOCAL_WORLD_SIZE": local_world,
        "MASTER_ADDR": ips[0] if ips else None,
        "MASTER_PORT": str(DEFAULT_MASTER_PORT),
    }
    if local_world == "1":
        values.update(RANK=node_rank, WORLD_SIZE=values["NUM_NODES"], LOCAL_RANK="0")
    return values


def _detect() -> dict[str, str | None]:
    """Pick the source. MPI before Slurm: mpirun inside an sbatch job also sees the job's
    SLURM_*, which then describe mpirun's daemons, not the ranks. Unless they agree with the
    MPI ranks (srun started the MPI tasks itself): Slurm knows more (local sizes, hosts)."""
    slurm_rank = (_get("SLURM_PROCID"), _get("SLURM_NTASKS", "SLURM_NPROCS"))
    for rank_var, size_var in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
    ):
        if None not in slurm_rank and (_get(rank_var), _get(size_var)) == slurm_rank:
            return _from_slurm()
    if _get("OMPI_COMM_WORLD_RANK") and _get("OMPI_COMM_WORLD_SIZE"):
        return _from_mpi(
            os.environ["OMPI_COMM_WORLD_RANK"],
            os.environ["OMPI_COMM_WORLD_SIZE"],
            _get("OMPI_COMM_WORLD_LOCAL_RANK"),
            _get("OMPI_COMM_WORLD_LOCAL_SIZE"),
        )
    if _get("PMI_RANK") and _get("PMI_SIZE"):
        return _from_mpi(
            os.environ["PMI_RANK"],
            os.environ["PMI_SIZE"],
            _get("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
            _get("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
        )
    if _get("SLURM_PROCID"):
        return _from_slurm()
    if _get("SKYPILOT_NODE_RANK"):
        return _from_skypilot()
    return {}


def init_env() -> dict[str, str]:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (and GROUP_RANK),
    NUM_NODES, MASTER_ADDR and MASTER_PORT in os.environ from SLURM_*, OMPI_COMM_WORLD_*,
    PMI_* or SKYPILOT_* variables, returning what it set.

    A variable already set (non-empty) is never overwritten: torchrun, trebuchet's native
    launcher or the user know better than a guess. Unknown values are left unset. Calling it
    twice is harmless; with no such variables it does nothing and returns {}.
    """
    values = _detect()
    if values.get("NODE_RANK") is not None:
        values["GROUP_RANK"] = values["NODE_RANK"]
    done: dict[str, str] = {}
    for name, value in values.items():
        if value is not None and not os.environ.get(name):
            os.environ[name] = done[name] = value
    return done
