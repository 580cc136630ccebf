"""The job file (`job.json`) every engine hands to trebuchet's runtime on its nodes.

Why one module: the runtime reads the same values wherever it runs, so they are computed
once here; `controller_job` adds what a job controller reads (local, ssh, Slurm),
`node_job` what the node verb reads on engines that start one process per node themselves
(SkyPilot, Kubernetes: they ship it with the runtime archive and start
`python3 -S <runtime> node <job.json>` on every node).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trebuchet.envs.build import run_prefix
from trebuchet.envs.recipe import Recipe
from trebuchet.errors import UserError
from trebuchet.launcher.plan import command_argv, profiled
from trebuchet.runtime.contracts.schema import JobFile

if TYPE_CHECKING:
    from trebuchet.spec.load import LoadedSpec

SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def command(spec: Any, recipe: Recipe | None = None) -> list[str]:
    """The spec's command as argv: nsys wraps the selected ranks as locally; a conda
    environment runs it through its prefix."""
    cmd = profiled(spec, command_argv(spec.command))
    if recipe is not None and recipe.kind == "conda":
        cmd = [*run_prefix(recipe), *cmd]
    return cmd


def grace_seconds(spec: Any) -> int:
    """The grace period in whole seconds (>= 1): what an engine's own limits add for it."""
    return max(1, int(-(-getattr(spec, "grace_period", 5.0) // 1)))


def grace(spec: Any) -> float:
    """The grace period as the spec says it (a whole number as an int: `"grace": 5`)."""
    g = float(getattr(spec, "grace_period", 5.0))
    return int(g) if g.is_integer() else g


def common(spec: Any, run_id: str, recipe: Recipe | None = None) -> JobFile:
    """The values of every engine's job file (the optional ones only when set)."""
    job: JobFile = {
        "run_id": run_id,
        "launcher": spec.launcher,
        "nodes": spec.nodes,
        "ppn": spec.ranks_per_node,
        "command": command(spec, recipe),
        "grace": grace(spec),
        "checkpoint_signal": getattr(spec, "checkpoint_signal", "SIGUSR2"),
        "secrets": sorted(spec.secrets),
        "spec_env": sorted(spec.env),
    }
    for name in ("spare_nodes", "min_nodes"):  # only when set (docs/recovery.md)
        if getattr(spec, name, None):
            job[name] = getattr(spec, name)
    if getattr(spec, "no_retry_exit_codes", None):  # only when set (runtime/job/retry_codes.py)
        job["no_retry_exit_codes"] = list(spec.no_retry_exit_codes)
    if getattr(spec, "retry_exit_codes", None) is not None:
        job["retry_exit_codes"] = list(spec.retry_exit_codes)
    job.update(cast(JobFile, health_fields(spec)))
    lost = getattr(spec, "node_timeout", None)
    if lost is not None and lost != 10.0:  # the runtime's default (agent_link.NODE_TIMEOUT_S)
        job["node_timeout"] = lost
    hang = getattr(spec, "hang_timeout", None)
    if hang:
        job["hang_timeout"], job["on_hang"] = hang, spec.on_hang
    from trebuchet.spec import readers

    if readers.needed(spec):  # only when not the defaults (runtime/watch/metric_reader.py, gpu.py)
        job["metrics"] = readers.reader_config(spec)
    return job


def health_fields(spec: Any) -> dict[str, Any]:
    """What the nodes' health checks need beyond the rank contract (runtime/node/health.py)."""
    out: dict[str, Any] = {}
    if getattr(spec, "health_check", None):
        out["health_check"] = spec.health_check
        out["health_check_timeout"] = float(spec.health_check_timeout)
    if (getattr(spec, "gpus_per_node", 0) or 0) > 0:
        out["gpus_per_node"] = int(spec.gpus_per_node)
    return out


def controller_job(spec: Any, run_id: str, run_dir: Path | str,
                   recipe: Recipe | None = None) -> JobFile:  # fmt: skip
    """The common values and what a job controller reads (runtime/job/life.py settings)."""
    from trebuchet.launcher.policies import policies_for

    job = common(spec, run_id, recipe)
    job["run_dir"], job["max_attempts"] = str(run_dir), spec.retries + 1
    if spec.timeout:
        job["timeout"], job["warning"] = spec.timeout, spec.warning_seconds
    job["policies"] = policies_for(spec) if hasattr(spec, "log_policies") else []
    job["pre"], job["post"] = getattr(spec, "pre", None) or "", getattr(spec, "post", None) or ""
    return job


def engine_options(spec: Any, engine: str) -> Any:
    """The spec's block of an engine's options (`spec.ssh`): a field unknown to the Spec
    class, so callers annotate what they get (`sp: Ssh = engine_options(spec, "ssh")`)."""
    return getattr(spec, engine)


def uses_secret(value: str, secrets: list[str]) -> bool:
    """True when an env value names one of the spec's secrets (`${HF_TOKEN}`)."""
    return any(m.group(1) in secrets for m in SECRET_REF.finditer(value))


def node_job(spec: Any, run_id: str, checkpoint_dir: str | None = None,
             job: JobFile | None = None) -> JobFile:  # fmt: skip
    """What the runtime's `node` verb reads. The node expands the env values that use a
    ${SECRET}: the engine gives the node the secrets, never the manifest. `checkpoint_dir`:
    storage the engine mounts (else the node-local run directory's `checkpoints/`)."""
    secrets = list(spec.secrets)
    job = common(spec, run_id) if job is None else job
    if checkpoint_dir:
        job["checkpoint_dir"] = checkpoint_dir
    job["timeout"], job["warning"] = spec.timeout, spec.warning_seconds
    job["secret_env"] = {k: v for k, v in spec.env.items() if uses_secret(v, secrets)}
    job["profile"], job["profile_ranks"] = spec.profile, spec.profile_ranks
    job["max_attempts"] = spec.retries + 1  # TORCHELASTIC_MAX_RESTARTS of native ranks
    return job


def job_text(job: JobFile) -> str:
    """job.json as every engine ships it: one key per line, to review in `treb render`."""
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in sorted(job.items())]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def refuse_spares(spec: Any, loaded: LoadedSpec, engine: str) -> None:
    """Spare nodes and node ranges need a controller that chooses each attempt's nodes
    (runtime/job/nodeset.py): an engine that places nodes itself says no, not ignore them."""
    if spec.spare_nodes:
        raise loaded.refusal("spare_nodes", f"not supported on {engine} (docs/recovery.md)")
    if spec.min_nodes is not None:
        raise loaded.refusal("nodes", f"a node range MIN:MAX is not supported on {engine} "
                                      "(docs/recovery.md); give one number")  # fmt: skip


def check_node_engine(
    spec: Any, loaded: LoadedSpec | str, engine: str, horovod: bool = False
) -> None:
    """What the node verb does not run on an engine that starts one process per node.
    `horovod`: the engine gives node 0's horovodrun the hosts (ssh: runtime/node/horovodrun.py)."""

    def refuse(field: str, why: str) -> UserError:
        if isinstance(loaded, str):
            return UserError(f"{loaded}: {field}: {why}")
        return loaded.refusal(field, why)

    if spec.launcher == "horovod" and horovod:
        from trebuchet.runtime.node.horovodrun import env_problem

        bad = env_problem(dict(spec.env))
        if bad:
            raise refuse(*bad)
    elif spec.launcher in ("mpirun", "horovod"):
        raise refuse(
            "launcher",
            f"{spec.launcher} is not rendered for {engine}; use native, torchrun or none",
        )
    if spec.gpus_per_node == -1:
        raise refuse(
            "gpus_per_node",
            f"-1 (all visible) has no {engine} equivalent: give the number of GPUs per node",
        )


def start_lines(runtime: str, job: str) -> list[str]:
    """The last lines of an engine's node script: a clear error without python3, then the
    node agent in place of the shell (signals reach it directly). Shell words, quoted."""
    from trebuchet.runtime.node.task import NO_PYTHON  # not on the local launch path

    return [NO_PYTHON, f"exec python3 -S {runtime} node {job}"]


def write_job_files(run_dir: Path, job: JobFile) -> tuple[Path, Path]:
    """The runtime archive and job.json in the run directory, where the engine's upload
    (file_mounts, a ConfigMap) takes them from."""
    from trebuchet.launcher.runtime_file import ship
    from trebuchet.store.files import write_atomic

    runtime = ship(run_dir)
    path = run_dir / "job.json"
    write_atomic(path, job_text(job))
    return runtime, path


def require(module: str, engine: str, sub: Any = None) -> None:
    """An engine's client package, needed to submit or cancel but not to render; a
    submission `sub` without it is recorded FAILED."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        why = f"the {engine} package is not installed"
        if sub is not None:
            failed(sub, why)
        install = f"install it with: pip install 'trebuchet[{engine}]'"
        raise UserError(f"--on {engine}: {why}; {install}") from None


def failed(sub: Any, why: str) -> None:
    from trebuchet.store import lifecycle

    lifecycle.ended(sub.store, sub.record.id, "FAILED", why, "failed")


def running(sub: Any, engine: str, backend_id: str, **event: Any) -> None:
    """The engine took the run: RUNNING from here as far as trebuchet sees (the run's
    duration counts from now)."""
    import time

    from trebuchet.store import lifecycle
    from trebuchet.store.files import append_event

    sub.store.update_run(sub.record.id, backend_id=backend_id)
    append_event(sub.run_dir, engine, **event, backend_id=backend_id)
    lifecycle.record(sub.store, sub.record.id, "state", state="RUNNING", started_at=time.time())
