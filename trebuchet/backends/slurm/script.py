"""Spec -> sbatch script (#SBATCH lines, the spec's env, slurm.setup, the controller's start)
and the job file the controller reads (`job.json`: every other value, as JSON).

Why a generated script and not a template users edit: each pitfall of hand-written sbatch
scripts is handled once here (tasks per node by launcher, runtime expansion of $RANK and
$SLURM_NODEID, a per-job port, secrets by name only, srun flags 22.05 no longer inherits),
and every value is one shlex-quoted word or JSON, so no value can break the script or run
code. What runs in the job (attempts, the node agents) is trebuchet's runtime, shipped into
the run directory as one file (trebuchet/runtime, launcher/runtime_file.py).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from trebuchet.backends.job_file import (
    SECRET_REF,
    controller_job,
    grace_seconds,
    job_text,
    write_job_files,
)
from trebuchet.backends.slurm import argv as slurm_argv
from trebuchet.backends.slurm.checks import TIME_ALLOWED, slurm_seconds, time_arg
from trebuchet.envs.recipe import Recipe
from trebuchet.launcher.policies import policies_for
from trebuchet.launcher.runtime_file import file_name as runtime_file_name
from trebuchet.runtime.contracts.schema import JobFile
from trebuchet.runtime.node.per_node import SETUP_ENV_FD, SETUP_ENV_VAR
from trebuchet.spec.duration import MAX_SECONDS, slurm_time
from trebuchet.store.files import write_atomic

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
REQUEUE_MARGIN_S = 10  # requeue this long before the time limit when ranks do not stop
# --time from `timeout` alone (job_seconds): per attempt, beyond its timeout and grace period,
# the start and end of its srun steps and the pre/post commands; once, the controller's start.
ATTEMPT_MARGIN_S = 30
JOB_MARGIN_S = 60
# sbatch options (long names) trebuchet sets itself; the spec field to use instead.
MANAGED = {
    "nodes": "nodes", "ntasks": "procs_per_node", "ntasks-per-node": "procs_per_node",
    "tasks-per-node": "procs_per_node", "output": "(the run directory)",
    "error": "(the run directory)", "open-mode": "(the run directory)", "job-name": "name",
    "signal": "timeout_warning / checkpoint_signal", "time": "slurm.time or timeout",
    "requeue": "retries", "no-requeue": "retries", "chdir": "workdir", "wrap": "command",
}  # fmt: skip
# sbatch options that change what sbatch does at submission, not what the job gets.
REFUSED = {
    "array": "a sweep is trebuchet's job array (-o key=a,b or sweep:)",
    "parsable": "trebuchet reads sbatch's answer itself",
    "test-only": "use treb render / treb check",
    "wait": "trebuchet follows the job itself (treb run without --detach)",
    "help": "it prints help instead of submitting", "usage": "it prints help instead of submitting",
    "version": "it prints its version instead of submitting",
}  # fmt: skip


def q(value: object) -> str:
    return shlex.quote(str(value))


def time_limit(spec: Any) -> tuple[str | None, float | None]:
    """The --time value and its seconds: slurm.time when set (the whole job's limit, the
    user's), else enough for every attempt the spec's per-attempt timeout allows."""
    if spec.slurm.time:  # "90s" is 00:02:00: Slurm counts whole minutes
        arg = time_arg(spec.slurm.time)
        return arg, slurm_seconds(arg)
    if spec.timeout:
        seconds = job_seconds(spec)
        return slurm_time(seconds), float(seconds)
    return None, None


def most_attempts(spec: Any) -> int:
    """The attempts a job may run: retries + 1, plus every retry the log policies could
    grant (each `retry` policy's max_retries; runtime/policies.decide)."""
    found = policies_for(spec) if hasattr(spec, "log_policies") else []
    granted = sum(int(p.get("max_retries", 3)) for p in found if p["action"] == "retry")
    return spec.retries + 1 + granted


def job_seconds(spec: Any) -> float:
    """--time when only `timeout` is set: the job controller holds each attempt to it, so
    the job needs, per attempt, the timeout, the grace period of the stop after it and
    ATTEMPT_MARGIN_S, and JOB_MARGIN_S once (at most MAX_SECONDS)."""
    per_attempt = float(spec.timeout) + grace_seconds(spec) + ATTEMPT_MARGIN_S
    return min(float(MAX_SECONDS), most_attempts(spec) * per_attempt + JOB_MARGIN_S)


def warning_seconds(spec: Any, limit: float | None) -> int | None:
    """When Slurm sends the checkpoint signal before the limit (whole seconds, >= 1)."""
    if limit is None:
        return None
    warn = getattr(spec, "timeout_warning", None)
    warn = min(warn, limit) if warn else min(60.0, 0.1 * limit)
    return max(1, int(-(-warn // 1)))


def tasks_per_node(spec: Any) -> int:
    """The allocation's tasks per node (sbatch): native holds one per rank (the per-rank
    --cpus-per-task is Slurm's to multiply); torchrun, none, mpirun one per node (seed 004)."""
    return spec.ranks_per_node if spec.launcher == "native" else 1


def srun_starts_ranks(spec: Any) -> bool:
    """Whether the ranks' srun step starts every rank as a task of its own: only where
    srun must, native with `slurm.mpi` (PMIx/PMI2 wire each task up). Otherwise it starts
    one task per node, the node's agent, which starts the node's ranks itself (issue 36:
    one interpreter and one link per node, not per rank)."""
    return spec.launcher == "native" and bool(spec.slurm.mpi)


def cpus_per_task(spec: Any) -> int | None:
    """slurm.cpus_per_task is per rank; a per-node task (torchrun, none) needs them all."""
    cpus = spec.slurm.cpus_per_task
    if cpus is None:
        return None
    return cpus if spec.launcher == "native" else cpus * spec.ranks_per_node


def problems(spec: Any) -> list[tuple[tuple[str, ...], str]]:
    """(field path, why) for what cannot go into an sbatch script safely or at all."""
    out: list[tuple[tuple[str, ...], str]] = []
    sl = spec.slurm
    for name in ("account", "partition", "qos", "constraint", "mem", "time", "mpi"):
        value = getattr(sl, name)
        if value is not None and (CONTROL.search(value) or '"' in value or not value.strip()):
            out.append((("slurm", name), "must be one line without double quotes"))
    if sl.time:
        try:
            seconds = slurm_seconds(sl.time)
        except ValueError:
            out.append((("slurm", "time"), f"{sl.time!r} is not {TIME_ALLOWED}"))
        else:
            if seconds is not None and seconds > MAX_SECONDS:
                out.append((("slurm", "time"), f"{sl.time!r} is more than "
                            f"{MAX_SECONDS // 86400} days (UNLIMITED: no limit)"))  # fmt: skip
    out += [(("slurm", "sbatch_args"), why) for why in sbatch_args_problems(sl.sbatch_args)]
    for i, line in enumerate(sl.setup):
        if "\n" in line or "\r" in line:
            out.append((("slurm", "setup"), f"item {i}: one shell line per item"))
    if spec.gpus_per_node == -1:
        out.append((("gpus_per_node",), "-1 (all visible) has no Slurm equivalent: give the "
                    "number of GPUs per node"))  # fmt: skip
    signal = getattr(spec, "checkpoint_signal", "SIGUSR2")
    if signal == "SIGTERM":
        out.append((("checkpoint_signal",), "SIGTERM is what Slurm sends at the time limit: "
                    "use SIGUSR1 or SIGUSR2"))  # fmt: skip
    env = spec.environment
    for i, mount in enumerate(env.mounts if env else []):
        if "," in mount or CONTROL.search(mount):
            out.append((("environment", "mounts"), f"item {i}: no commas (pyxis separator)"))
    return out


def sbatch_args_problems(args: list[str]) -> list[str]:
    """Why `slurm.sbatch_args` cannot go into the script: read as sbatch reads them."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if CONTROL.search(arg) or '"' in arg or not arg.strip():
            out.append(f"item {i} ({arg!r}): one line, no double quotes")
    if out:
        return out
    options, bad = slurm_argv.parse(args)
    out += [f"item {i}: {why}" for i, why in bad]
    for opt in options:
        spelled = f"item {opt.item} ({opt.text})"
        if opt.name in MANAGED:
            out.append(f"{spelled} is --{opt.name}, set by trebuchet: use "
                       f"{MANAGED[opt.name]} in the spec")  # fmt: skip
        elif opt.name in REFUSED:
            out.append(f"{spelled} is --{opt.name}: {REFUSED[opt.name]}")
        elif opt.name == "export" and not (opt.value or "").startswith("ALL"):
            out.append("--export must keep ALL: the job gets PATH and the secrets from the "
                       "submitting environment")  # fmt: skip
    return out


def _directive(flag: str, value: object | None = None) -> str:
    """One #SBATCH line; sbatch reads double-quoted values (checked free of quotes)."""
    if value is None:
        return f"#SBATCH {flag}"
    text = str(value)
    if re.search(r"[\s#'$`\\]", text):
        text = f'"{text}"'
    return f"#SBATCH {flag}={text}"


def _extra_arg(arg: str) -> str:
    flag, eq, value = arg.partition("=")
    return _directive(flag, value) if eq else f"#SBATCH {arg}"


def sbatch_lines(spec: Any, run_dir: Path) -> list[str]:
    sl = spec.slurm
    lines = [
        _directive("--job-name", spec.name),
        _directive("--nodes", allocation_nodes(spec)),
        _directive("--ntasks-per-node", tasks_per_node(spec)),
    ]
    if spec.spare_nodes or spec.min_nodes is not None:  # a node's loss must not end the job
        lines.append(_directive("--no-kill"))
    cpus = cpus_per_task(spec)
    if cpus:
        lines.append(_directive("--cpus-per-task", cpus))
    if spec.gpus_per_node > 0:
        lines.append(_directive("--gpus-per-node", spec.gpus_per_node))
    for flag, value in (("--mem", sl.mem), ("--account", sl.account),
                        ("--partition", sl.partition), ("--qos", sl.qos),
                        ("--constraint", sl.constraint)):  # fmt: skip
        if value:
            lines.append(_directive(flag, value))
    if sl.exclusive:
        lines.append(_directive("--exclusive"))
    limit_text, limit = time_limit(spec)
    if limit_text:
        lines.append(_directive("--time", limit_text))
    # Slurm warns before the user's slurm.time only: the controller warns before a timeout.
    warn = warning_seconds(spec, limit) if sl.time else None
    if warn:
        sig = getattr(spec, "checkpoint_signal", "SIGUSR2").removeprefix("SIG")
        lines.append(_directive("--signal", f"B:{sig}@{warn}"))
    lines.append(_directive("--requeue" if spec.retries else "--no-requeue"))
    out = str(run_dir / "batch.log").replace("%", "%%")
    lines += [_directive("--output", out), _directive("--open-mode", "append")]
    lines += [_extra_arg(a) for a in sl.sbatch_args]
    return lines


def allocation_nodes(spec: Any) -> int:
    """sbatch's --nodes: the spec's nodes (MAX of a range `MIN:MAX`) and its spares
    (docs/recovery.md). Not Slurm's own range `--nodes=MIN-MAX`: with --ntasks-per-node,
    22.05 grants MIN even where MAX nodes are idle."""
    return int(spec.nodes + spec.spare_nodes)


def srun_args(spec: Any, run_dir: Path, workdir: Path, per_node: bool = False) -> list[str]:
    """srun flags of one step: the ranks (or, per_node, one task per node for pre/post)."""
    ranks = not per_node and srun_starts_ranks(spec)
    ntasks = spec.ranks_per_node if ranks else 1
    # mpirun: one task on the first node; OpenMPI starts its daemons on the others itself.
    mpi = spec.launcher in ("mpirun", "horovod")  # horovod on Slurm: under mpirun
    nodes = 1 if mpi and not per_node else spec.nodes
    # --ntasks too: the step would otherwise take the job's SLURM_NTASKS from the batch env.
    args = [f"--nodes={nodes}", f"--ntasks={nodes * ntasks}",
            f"--ntasks-per-node={ntasks}", "--kill-on-bad-exit=0", "--export=ALL"]  # fmt: skip
    cpus = cpus_per_task(spec)
    if spec.launcher == "native" and not ranks and not per_node:
        # the node agent's one task: the node's whole share (CPUs, GPUs) for its ranks
        args.append("--whole")
    elif cpus and not per_node:
        args.append(f"--cpus-per-task={cpus}")  # 22.05's srun no longer inherits it
    if spec.slurm.mpi and not per_node and not mpi:
        args.append(f"--mpi={spec.slurm.mpi}")
    env = spec.environment
    if env is not None and env.image:
        mounts = [f"{run_dir}:{run_dir}", f"{workdir}:{workdir}", *env.mounts]
        args += [f"--container-image={env.image}", f"--container-mounts={','.join(mounts)}",
                 f"--container-workdir={workdir}", "--no-container-mount-home"]  # fmt: skip
    return args


def env_value(value: str, secrets: set[str]) -> str:
    """A shell word for an env value: literal text quoted, ${SECRET} expanded in the job."""
    parts: list[str] = []
    pos = 0
    for m in SECRET_REF.finditer(value):
        if m.group(1) not in secrets:
            continue
        if m.start() > pos:
            parts.append(q(value[pos : m.start()]))
        parts.append(f'"${{{m.group(1)}}}"')
        pos = m.end()
    if pos < len(value) or not parts:
        parts.append(q(value[pos:]))
    return "".join(parts)


def _environment_lines(spec: Any, run_dir: Path, recipe: Recipe | None) -> list[str]:
    """Exports every task inherits: a venv's PATH, the profiling variables."""
    lines = []
    if recipe is not None and recipe.kind == "venv":
        bin_dir = q(recipe.prefix + "/bin")
        lines.append(f'export VIRTUAL_ENV={q(recipe.prefix)} PATH={bin_dir}:"$PATH"')
    if spec.profile == "torch":
        lines.append(f"export TREB_TORCH_PROFILE_DIR={q(run_dir / 'profile' / 'torch')}")
    if spec.profile_ranks is not None:
        lines.append(f"export TREB_PROFILE_RANKS={q(' '.join(map(str, spec.profile_ranks)))}")
    return lines


def job_file(spec: Any, workdir: Path, run_id: str, run_dir: Path,
             recipe: Recipe | None = None) -> JobFile:  # fmt: skip
    """What the job controller and the node agents read (`<run dir>/job.json`): the values
    of every engine's job file (job_file.py), and Slurm's own."""
    secrets = sorted(spec.secrets)
    slurm: JobFile = {
        **controller_job(spec, run_id, run_dir, recipe),
        "workdir": str(workdir),
        "requeue_margin": REQUEUE_MARGIN_S,
        "master_port": getattr(spec, "fixed_port", None) or spec.master_port,
        "srun": srun_args(spec, run_dir, workdir),
        "srun_hook": srun_args(spec, run_dir, workdir, per_node=True),
        # mpirun: the spec's variables reach remote ranks only with -x
        "mpi_env": sorted({*spec.env, *secrets})
        if spec.launcher in ("mpirun", "horovod") else [],
        "inline": inline(spec),
    }  # fmt: skip
    from trebuchet.runtime.slurm.step import parks

    if not slurm["inline"] and parks(slurm):  # as the controller runs it (its no_kill)
        slurm["srun"].append("--no-kill")
    return slurm


def inline(spec: Any) -> bool:
    """The job's only task runs in the batch step, by the controller itself, when srun
    would add nothing but a second interpreter and a step: one node, one task (native
    with one rank, or `none`), no `slurm.mpi` (PMI comes from srun), no container image
    (pyxis is an srun plugin). A 200-point sweep of such jobs starts half the processes."""
    env = spec.environment
    one_task = spec.launcher == "none" or (spec.launcher == "native" and spec.ranks_per_node == 1)
    alone = spec.nodes == 1 and not spec.spare_nodes  # a spare: the task may move to it
    checked = bool(getattr(spec, "health_check", None))  # the node's checks run in its task
    return alone and one_task and not checked and not spec.slurm.mpi and not (env and env.image)


def render_script(spec: Any, workdir: Path, run_id: str, run_dir: Path,
                  recipe: Recipe | None = None, after: list[str] | None = None) -> str:  # fmt: skip
    """The whole sbatch script for one run (job.json beside it holds the other values);
    `after`: the #SBATCH lines of its --after dependencies (dependency.py)."""
    secrets = set(spec.secrets)
    runtime = runtime_file_name()
    lines = [
        "#!/bin/bash",
        f"# trebuchet run {run_id} ({spec.name}): {spec.nodes} node(s) x "
        f"{spec.ranks_per_node} rank(s), launcher {spec.launcher}, "
        f"{spec.retries + 1} attempt(s) at most.",
        "# Rendered by `treb render --on slurm`, submitted by `treb run --on slurm`. The job",
        "# controller (attempts, retries, requeue) and the node agents (one srun step per",
        "# attempt) are trebuchet's runtime, shipped in the run directory with job.json.",
        *sbatch_lines(spec, run_dir),
        *(after or []),
        "",
        f"TREB_RUN_DIR={q(run_dir)}",
        f'TREB_RUNTIME="$TREB_RUN_DIR"/{q(runtime)}',
        '[ -r "$TREB_RUNTIME" ] || { echo "treb: $TREB_RUNTIME not found on $(hostname) '
        '(TREB_HOME must be on a filesystem every node shares)" >&2; exit 2; }',
        *_environment_lines(spec, run_dir, recipe),
    ]
    if spec.env:
        lines += ["# env from the spec; secrets come from the submitting environment, by name"]
        lines += [f"export {k}={env_value(v, secrets)}" for k, v in spec.env.items()]
    if spec.slurm.setup:
        lines += ["# slurm.setup", *spec.slurm.setup]
    lines += [
        'command -v python3 >/dev/null 2>&1 || { echo "treb: no python3 (>= 3.8) on $(hostname):'
        " trebuchet's job controller needs it\" >&2; exit 2; }",
        # the environment made above reaches the ranks, whatever `python3` is (a pyenv shim)
        f"export {SETUP_ENV_VAR}={SETUP_ENV_FD}",
        f'exec python3 -S "$TREB_RUNTIME" controller "$TREB_RUN_DIR/job.json" '
        f"{SETUP_ENV_FD}< <(env -0)",
    ]
    return "\n".join(lines) + "\n"


def write_job(spec: Any, workdir: Path, run_id: str, run_dir: Path,
              recipe: Recipe | None = None, after: list[str] | None = None) -> Path:  # fmt: skip
    """Everything the job needs in its run directory: the runtime, job.json and the sbatch
    script (returned)."""
    write_job_files(run_dir, job_file(spec, workdir, run_id, run_dir, recipe))
    path = run_dir / "submit.sbatch"
    write_atomic(path, render_script(spec, workdir, run_id, run_dir, recipe, after))
    return path


def render_all(spec: Any, workdir: Path, run_id: str, run_dir: Path,
               recipe: Recipe | None = None, after: list[str] | None = None) -> str:  # fmt: skip
    """`treb render --on slurm`: the script, then the job file it hands to the controller."""
    job = job_text(job_file(spec, workdir, run_id, run_dir, recipe))
    return (render_script(spec, workdir, run_id, run_dir, recipe, after)
            + f"\n# ---- {run_dir / 'job.json'} (read by the job controller)\n{job}")  # fmt: skip
