"""The rank contract, defined once: which variables a rank gets, and how they are derived
from whatever started it (trebuchet's agent, torchrun, srun, mpirun, SkyPilot).

The local plan, the node agent on every engine, the MPI workers and
`trebuchet.dist.init_env()` (user code, before torch is imported) all need the same names
and formulas: written once here, they cannot drift.
"""

from __future__ import annotations

import os
import re
import subprocess

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Iterator, Mapping

__all__ = [
    "expand_hostlist", "init_env", "slurm_master_port", "rank_vars", "node_vars",
    "elastic_vars", "slurm_task_vars",
]  # fmt: skip

DEFAULT_MASTER_PORT = 29500  # torch's own default, for engines that do not give us a job id
# Names trebuchet itself sets in a rank (the spec's env may not set them, except MASTER_*).
RANK_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
              "ROLE_RANK", "ROLE_WORLD_SIZE")  # fmt: skip
NODE_NAMES = ("NODE_RANK", "GROUP_RANK", "NUM_NODES")


def rank_vars(rank: int, local_rank: int, node: int, nodes: int, ppn: int) -> dict[str, str]:
    """Where one rank is, as launcher native sets it (torchrun's GROUP_*, ROLE_* too)."""
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
    """What srun would tell the rank had it started it as a task of its own (the agent is
    srun's one task per node): Lightning's SLURMEnvironment then finds this rank."""
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


# torchrun's own variables for its workers (local_elastic_agent.py, _start_workers), given
# to native ranks too: is_torchelastic_launched() and Lightning behave as under torchrun,
# and @record writes its error file where the diagnosis reads it. Not
# TORCHELASTIC_USE_AGENT_STORE: init_process_group would wait for a torchrun agent's store.
ELASTIC_ROLE = "default"  # torchrun's --role default
ERRORS_DIR = "errors"  # attempt-<n>/errors/: beside, never among, the outcome records


def elastic_vars(run_id: str | None, max_restarts: int) -> dict[str, str]:
    """run_id None for ranks srun starts: with TORCHELASTIC_RUN_ID set, Lightning would take
    torchrun for their launcher and drop its SLURM auto-requeue."""
    out = {"TORCHELASTIC_MAX_RESTARTS": str(max(0, max_restarts)), "ROLE_NAME": ELASTIC_ROLE}
    if run_id:
        out["TORCHELASTIC_RUN_ID"] = run_id
    return out


def error_file(attempt_dir: str, name: str) -> str:
    """torch's @record only opens the file: the agent creates the folder."""
    return os.path.join(attempt_dir, ERRORS_DIR, name + ".json")


def attempt_elastic_vars(env: dict[str, str], attempt_dir: str, name: str) -> dict[str, str]:
    """The per-attempt part for a rank with TORCHELASTIC_MAX_RESTARTS: the attempt is the
    restart count (treb restarts, never torchrun); {} for any other process."""
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
    return {"NODE_RANK": str(node), "GROUP_RANK": str(node), "NUM_NODES": str(nodes)}


def omp_threads(cpus: int, ranks: int) -> str:
    return str(max(1, cpus // max(1, ranks)))


def mpi_rank_vars(environ: dict[str, str], ppn: int) -> dict[str, str]:
    """For a rank mpirun/horovodrun started (`--map-by slot`: the node is RANK // ppn)."""
    rank = _int(_get("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", environ=environ))
    size = _int(_get("OMPI_COMM_WORLD_SIZE", "HOROVOD_SIZE", "PMI_SIZE", environ=environ))
    if rank is None or size is None or ppn < 1:
        return {}
    return rank_vars(rank, rank % ppn, rank // ppn, max(1, size // ppn), ppn)


def _get(*names: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The first of these variables that is set and non-empty."""
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def expand_hostlist(expr: str) -> list[str]:
    """A Slurm hostlist (`nodeA,nodeB[1-3]`) as host names: python-hostlist, else scontrol,
    else a small parser, so that a missing optional dependency never leaves MASTER_ADDR unset."""
    try:
        import hostlist  # python-hostlist; lazy: only Slurm users need it
    except ImportError:
        pass
    else:
        return list(hostlist.expand_hostlist(expr, allow_duplicates=True))  # as Slurm does
    try:
        argv = ["scontrol", "show", "hostnames", expr]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout
        hosts = out.split()
        if hosts:
            return hosts
    except (OSError, subprocess.SubprocessError):
        pass
    return _expand_builtin(expr)


def _expand_builtin(expr: str) -> list[str]:
    return [name for item in re.findall(HOSTLIST_ITEM, expr) for name in item_names(item.strip())]


HOSTLIST_ITEM = r"(?:[^,\[\]]|\[[^\[\]]*\])+"  # a hostlist's item: a name, ranges in brackets
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")


def item_names(item: str) -> Iterator[str]:
    """One hostlist item's names (`tn[1-2]x[3-4]`: tn1x3 tn1x4 tn2x3 tn2x4), lazily: a
    reader of a record a rank may have rewritten takes the first few of tn[1-999999999].
    An item whose brackets are not ranges, or a range that runs backwards, gives none."""
    m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\](.*)", item)
    if m is None:
        if "[" not in item and "]" not in item:
            yield item
        return
    head, ranges, rest = m.groups()
    parts = [_RANGE.fullmatch(p) for p in ranges.split(",")]
    if not all(p and int(p[1]) <= int(p[2] or p[1]) for p in parts):
        return
    if next(item_names(rest), None) is None:
        return
    for p in parts:
        assert p is not None
        for n in range(int(p[1]), int(p[2] or p[1]) + 1):
            for tail in item_names(rest):
                yield f"{head}{n:0{len(p[1])}d}{tail}"


def slurm_master_port(job_id: str) -> int:
    """Megatron Bridge's convention: every task derives the same port without talking, and
    concurrent jobs sharing a node rarely collide."""
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
    values: dict[str, str | None] = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": local_rank,
                                     "LOCAL_WORLD_SIZE": local_size}  # fmt: skip
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
    """SkyPilot runs the command once per node: a process rank is known only with one GPU
    (or none) per node; otherwise LOCAL_WORLD_SIZE says how many to start (launcher none)."""
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


# Open MPI's, then MPICH's / Intel MPI's: rank, size, local rank, local size
MPI_SOURCES = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",),
     ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
     ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
)  # fmt: skip


def _detect() -> dict[str, str | None]:
    """Pick the source. MPI before Slurm: mpirun inside an sbatch job also sees the job's
    SLURM_*, which then describe mpirun's daemons, not the ranks. Unless they agree with the
    MPI ranks (srun started the MPI tasks itself): Slurm knows more (local sizes, hosts)."""
    slurm_rank = (_get("SLURM_PROCID"), _get("SLURM_NTASKS", "SLURM_NPROCS"))
    for rank_var, size_var, _, _ in MPI_SOURCES:
        if None not in slurm_rank and (_get(rank_var), _get(size_var)) == slurm_rank:
            return _from_slurm()
    for rank_var, size_var, local_rank, local_size in MPI_SOURCES:
        rank, size = _get(rank_var), _get(size_var)
        if rank and size:
            return _from_mpi(rank, size, _get(*local_rank), _get(*local_size))
    if _get("SLURM_PROCID"):
        return _from_slurm()
    if _get("SKYPILOT_NODE_RANK"):
        return _from_skypilot()
    return {}


def init_env() -> dict[str, str]:
    """The rank's variables set in os.environ from SLURM_*, OMPI_COMM_WORLD_*, PMI_* or
    SKYPILOT_*; returns what it set. A variable already set is never overwritten: torchrun,
    the native launcher or the user know better than a guess."""
    values = _detect()
    if values.get("NODE_RANK") is not None:
        values["GROUP_RANK"] = values["NODE_RANK"]
    done: dict[str, str] = {}
    for name, value in values.items():
        if value is not None and not os.environ.get(name):
            os.environ[name] = done[name] = value
    return done
