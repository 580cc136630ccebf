"""What each process of a local run gets: argv, environment, working directory, log file.

The local engine's part of the job file (`job.json`'s `plan`, contracts.LocalPlan): plain
JSON, computed once at submission, so the supervisor that executes it needs neither
pydantic nor the spec, and `treb render --on local` shows exactly it.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from trebuchet.envs.gpus import gpu_env
from trebuchet.envs.recipe import Recipe
from trebuchet.envs.wrap import wrap_argv
from trebuchet.launcher.rank_wrapper import AGENT_LAUNCHERS
from trebuchet.launcher.runtime_file import file_name as runtime_file_name
from trebuchet.plain import field, record
from trebuchet.runtime.contracts.rank_env import elastic_vars, node_vars, omp_threads, rank_vars
from trebuchet.runtime.contracts.schema import JobFile, LocalPlan, ProcPlan

# profile: nsys wraps each selected rank (RANK is known inside the rank, under any launcher).
NSYS_OPTIONS = "--trace=cuda,nvtx,osrt,cudnn,cublas --sample=none --force-overwrite=true"
NSYS_WRAPPER = (  # under launcher none, profile_ranks are node ranks (reports node-<n>)
    'r="${RANK:-$NODE_RANK}"; n="${RANK:+rank-$RANK}"; n="${n:-node-$NODE_RANK}"; '
    'case " ${TREB_PROFILE_RANKS:-$r} " in *" $r "*) '
    'out="$TREB_RUN_DIR/profile/attempt-$TREB_ATTEMPT/$n"; mkdir -p "${out%/*}"; '
    f'exec nsys profile {NSYS_OPTIONS} -o "$out" "$@";; '
    'esac; exec "$@"'
)


def profiled(spec: Any, argv: list[str]) -> list[str]:
    """argv wrapped in `nsys profile` when the spec asks for it."""
    if spec.profile != "nsys":
        return argv
    return ["bash", "-c", NSYS_WRAPPER, "treb-nsys", *argv]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel's pick). The socket module's C core:
    `socket` itself costs ~4 ms to import (its enums and selectors), at every launch."""
    import _socket

    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def proc(label: str, node: int, rank: int | None, local_rank: int | None, argv: list[str],
         env: dict[str, str], cwd: str, log: str) -> ProcPlan:  # fmt: skip
    """One process of the plan."""
    return {"label": label, "node": node, "rank": rank, "local_rank": local_rank,
            "argv": argv, "env": env, "cwd": cwd, "log": log}  # fmt: skip


def command_argv(command: str | list[str]) -> list[str]:
    """A string runs in bash (its $VARS expand on the node); a list runs as is."""
    return ["bash", "-c", command] if isinstance(command, str) else list(command)


@record
class Placement:
    """What the local machine gives a run: GPUs per simulated node and the environment."""

    vendor: str = "none"
    node_gpus: list[list[str]] = field(default_factory=list)
    recipe: Recipe | None = None


def ranks_per_node(spec: Any, place: Placement) -> int:
    """The spec's, or one rank per visible GPU (gpus_per_node: -1, no procs_per_node)."""
    if spec.procs_per_node is None and spec.gpus_per_node == -1 and place.node_gpus[0]:
        return len(place.node_gpus[0])
    return int(spec.ranks_per_node)


def local_plan(
    spec: Any, workdir: Path, run_id: str, run_dir: Path, environ: dict[str, str],
    place: Placement | None = None,
) -> LocalPlan:  # fmt: skip
    """Every process of the local engine's attempt."""
    place = place or Placement(node_gpus=[[] for _ in range(spec.nodes)])
    nodes = spec.nodes
    ppn = ranks_per_node(spec, place)
    world = nodes * ppn
    addr = spec.env.get("MASTER_ADDR", "127.0.0.1")
    port = spec.fixed_port or free_port("127.0.0.1")
    base = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "TREB_RUN_ID": run_id,
        "TREB_RUN_DIR": str(run_dir),
        "TREB_CHECKPOINT_DIR": str(run_dir / "checkpoints"),
        "TREB_CODE_DIR": str(workdir),
        "PYTHONUNBUFFERED": "1",
    }
    if spec.launcher != "none" and "OMP_NUM_THREADS" not in environ:
        # Simulated nodes share this machine, so its CPUs are split over all local ranks.
        # (a manual launch's node, --node-rank: this machine holds its own ranks only)
        here = ppn if environ.get("TREB_NODE_RANK_ONLY") is not None else world
        base["OMP_NUM_THREADS"] = omp_threads(usable_cpus(), here)
    recipe = place.recipe
    if recipe and recipe.kind == "venv":
        base["VIRTUAL_ENV"] = recipe.prefix
    if spec.profile_ranks is not None:
        base["TREB_PROFILE_RANKS"] = " ".join(str(r) for r in spec.profile_ranks)
    if spec.profile == "torch":  # the workload turns torch.profiler on when it sees this
        base["TREB_TORCH_PROFILE_DIR"] = str(run_dir / "profile" / "torch")
    cmd = profiled(spec, command_argv(spec.command))
    # Under torchrun/mpirun/horovodrun each worker runs the runtime's `worker` around its
    # rank (own log, own outcome record, signals), from the run directory.
    python = "python3" if recipe and recipe.kind == "image" else sys.executable
    worker: list[str] = []
    if spec.launcher in AGENT_LAUNCHERS:  # the runtime file is looked up (or built) for them
        worker = [python, "-S", str(run_dir / runtime_file_name()), "worker",
                  "--grace", str(spec.grace_period)]  # fmt: skip
    mounts = [f"{workdir}:{workdir}", f"{run_dir}:{run_dir}"]
    secret_names = list(spec.secrets)

    def wrap(argv: list[str], env: dict[str, str], node: int, label: str) -> list[str]:
        names = [*env, "TREB_ATTEMPT", *secret_names]
        gpus = place.node_gpus[node]
        return wrap_argv(recipe, argv, names, mounts, str(workdir), gpus, f"treb-{run_id}-{label}")

    procs: list[ProcPlan] = []
    streams: list[list[str]] = []
    hooks: dict[str, list[ProcPlan]] = {}
    # torchrun's manual multi-node launch (`--nnodes N --node-rank K` typed on each machine,
    # cli/torchrun_flags.py): this machine is node K of N and starts that node's ranks only.
    only = environ.get("TREB_NODE_RANK_ONLY")
    for node in range(nodes):
        if only is not None and only.isdigit() and node != int(only):
            continue
        # What the spec's env sets wins over what trebuchet derives (GPU masks included).
        node_env = {
            **base, **node_vars(node, nodes),
            **gpu_env(place.vendor, place.node_gpus[node], spec.gpus_per_node), **spec.env,
        }  # fmt: skip
        for when, text in (("pre", spec.pre), ("post", spec.post)):
            if text:
                env = {**node_env, "LOCAL_WORLD_SIZE": str(ppn)}
                argv = wrap(["bash", "-c", text], env, node, f"{when}{node}")
                log = f"{when}-node-{node}.log"
                hook = proc(f"{when}:{node}", node, None, None, argv, env, str(workdir), log)
                hooks.setdefault(when, []).append(hook)
        if spec.launcher == "native":
            for local in range(ppn):
                rank = node * ppn + local
                env = {**rank_vars(rank, local, node, nodes, ppn),
                       **elastic_vars(run_id, spec.retries), **node_env}  # fmt: skip
                label = f"{node}:{local}"
                argv = wrap(cmd, env, node, f"r{rank}")
                procs.append(
                    proc(label, node, rank, local, argv, env, str(workdir), f"rank-{rank}.log")
                )
                streams.append([label, f"rank-{rank}.log"])
        elif spec.launcher == "torchrun":
            argv = [
                "torchrun", "--nnodes", str(nodes), "--node_rank", str(node),
                "--nproc_per_node", str(ppn), "--master_addr", addr, "--master_port", str(port),
                "--rdzv-id", run_id, "--no-python", *worker, "--", *cmd,
            ]  # fmt: skip
            argv = wrap(argv, node_env, node, f"n{node}")
            procs.append(
                proc(f"{node}", node, None, None, argv, node_env, str(workdir), f"node-{node}.log")
            )
            streams.append([f"{node}", f"node-{node}.log"])
            for local in range(ppn):
                streams.append([f"{node}:{local}", f"rank-{node * ppn + local}.log"])
        elif spec.launcher in ("mpirun", "horovod"):
            if node == 0:  # one launcher process for the whole run, on the first node
                env = {**node_env, "LOCAL_WORLD_SIZE": str(ppn), "WORLD_SIZE": str(world)}
                env.pop("NODE_RANK")
                env.pop("GROUP_RANK")
                if spec.gpus_per_node != 0 and nodes > 1:  # each rank picks its node's mask
                    env["TREB_NODE_GPUS"] = ";".join(",".join(g) for g in place.node_gpus)
                if (
                    os.geteuid() == 0 and spec.launcher == "mpirun"
                ):  # OpenMPI refuses root otherwise
                    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
                argv = mpi_argv(spec.launcher, world, ["localhost"] * 1, world, env)
                argv += [*worker, "--mpi", str(ppn), "--", *cmd]
                argv = wrap(argv, env, node, "mpi")
                procs.append(proc("0", 0, None, None, argv, env, str(workdir), "node-0.log"))
                streams.append(["0", "node-0.log"])
            for local in range(ppn):
                streams.append([f"{node}:{local}", f"rank-{node * ppn + local}.log"])
        else:  # none: the user's own launcher, once per node
            env = {**node_env, "LOCAL_WORLD_SIZE": str(ppn)}
            argv = wrap(cmd, env, node, f"n{node}")
            procs.append(
                proc(f"{node}", node, None, None, argv, env, str(workdir), f"node-{node}.log")
            )
            streams.append([f"{node}", f"node-{node}.log"])
    return {
        "procs": procs, "streams": streams, "hooks": hooks, "master_addr": addr,
        "master_port": port, "port_auto": spec.fixed_port is None,
        "environment": recipe.to_json() if recipe else None,
        "path_prepend": [f"{recipe.prefix}/bin"] if recipe and recipe.kind == "venv" else [],
    }  # fmt: skip


def mpi_argv(
    launcher: str, np: int, hosts: list[str], slots: int, env: dict[str, str]
) -> list[str]:
    """`mpirun -np N -H host:slots,...` (OpenMPI) or `horovodrun` as Determined starts it."""
    host_list = ",".join(f"{h}:{slots}" for h in hosts)
    if launcher == "horovod":  # the controller and timeouts: the spec's HOROVOD_* env
        from trebuchet.runtime.node.horovodrun import horovodrun_argv  # socket: horovod's

        return horovodrun_argv(np, hosts, slots, env)
    argv = ["mpirun", "-np", str(np), "-H", host_list, "--bind-to", "none"]
    for name in sorted(env):  # mpirun passes variables to remote ranks only with -x
        argv += ["-x", name]
    return argv


def describe(job: JobFile, attempt: int = 0) -> str:
    """Human-readable plan: each process's command line and environment (secrets masked)."""
    plan = job["plan"]
    lines = [
        f"# {len(plan['procs'])} process(es), launcher {job['launcher']}, "
        f"{job['nodes']} node(s) x {job['ppn']}; inherits the submitting environment"
    ]
    if plan["environment"]:
        env = plan["environment"]
        where = env.get("image") or env.get("prefix")
        lines.append(f"# environment: {env['kind']} {where} (stamp {env.get('stamp') or '-'})")
    if plan["path_prepend"]:
        lines.append(f"# PATH starts with {':'.join(plan['path_prepend'])}")
    for when, hooks in plan["hooks"].items():
        for h in hooks:
            lines.append(f"\n[{when} node {h['node']}] cwd={shlex.quote(h['cwd'])}")
            lines.append("  $ " + shlex.join(h["argv"]))
    for p in plan["procs"]:
        env = {**p["env"], "TREB_ATTEMPT": str(attempt)}
        env.update({name: "***" for name in job["secrets"]})
        where = f"cwd={shlex.quote(p['cwd'])} log=attempt-{attempt}/{p['log']}"
        lines.append(f"\n[{p['label']}] {where}")
        lines += [f"  {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines.append("  $ " + shlex.join(p["argv"]))
    return "\n".join(lines) + "\n"
