"""The workload spec as typed models: one source of truth for validation and `treb schema`.

Each field carries `x-allowed`, the phrase used in error messages ("must be <allowed>").
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from trebuchet.runtime.contracts.rank_env import NODE_NAMES, RANK_NAMES
from trebuchet.spec.duration import ALLOWED as DURATION_ALLOWED
from trebuchet.spec.duration import parse_duration, parse_size
from trebuchet.spec.facts import EnvironmentFacts, SpecFacts
from trebuchet.spec.notify import MAX_HOOKS, Webhook
from trebuchet.spec.sweep import MAX_SWEEP_POINTS

NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"
Launcher = Literal["native", "torchrun", "mpirun", "horovod", "none"]


# Upper bounds (docs/spec.md "Limits"): far above any real job, low enough that a typo or a
# hostile value is refused with its line instead of allocating gigabytes or overflowing.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 64
MAX_WORLD = 1_000_000
MAX_RETRIES = 1000
MAX_TEXT = 100_000  # characters of a command, pre/post or env value (Linux: 128 KiB an argument)
MAX_PATH = 4095  # PATH_MAX - 1


def _no_bool(v: Any) -> Any:
    """YAML's true/false are not numbers (pydantic's lax mode would read true as 1)."""
    if isinstance(v, bool):
        raise ValueError("bad number")
    return v


Int = Annotated[int, BeforeValidator(_no_bool)]
ExitCode = Annotated[Int, Field(ge=0, le=255)]  # a process exit status


def _env_value(v: Any) -> str:
    """Env values may be written as numbers or booleans; the process sees strings."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, int, float)):
        text = str(v)
        if len(text) > MAX_TEXT:
            raise ValueError(f"longer than {MAX_TEXT} characters")
        return text
    raise ValueError("bad value")


# Written as "2h" or 7200 in YAML, held as seconds once validated.
Duration = Annotated[
    float,
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}]}),
]
EnvName = Annotated[str, Field(pattern=ENV_NAME_RE)]
# a Slurm node or ssh host name as store/node_events.py takes it, or * (any)
NodeName = Annotated[str, Field(pattern=r"^(?:\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$")]


def _comma_list(v: Any) -> Any:
    """`-o allow_nodes=tn1,tn2` (a string) as the list it means."""
    return [w.strip() for w in v.split(",") if w.strip()] if isinstance(v, str) else v


NodeNames = Annotated[list[NodeName], BeforeValidator(_comma_list)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]


def allowed(text: str, description: str, expand: bool = True, **kw: Any) -> Any:
    """A Field whose error phrase and editor help are given once. `expand=False`: a shell
    command, whose $VARS are the node shell's business at run time (expand.py)."""
    extra: dict[str, Any] = {"x-allowed": text}
    if not expand:
        extra["x-expand"] = False
    return Field(description=description, json_schema_extra=extra, **kw)


def _compiled(pattern: str) -> re.Pattern[bytes]:
    """A pattern as the node agent compiles it (on bytes)."""
    try:
        return re.compile(pattern.encode())
    except (re.error, OverflowError, RecursionError) as exc:  # a{10**20}; deep nests
        raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None


class Block(BaseModel):
    """Strict base: an unknown key is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class CondaEnv(Block):
    environment_file: str | None = allowed(
        "a path", "conda environment.yml, relative to the spec", default=None
    )
    python: str | None = allowed('a version string such as "3.11"', "Python version", default=None)
    conda_bin: str | None = allowed(
        "micromamba, mamba, conda or a path", "conda executable", default=None
    )


class Environment(Block, EnvironmentFacts):
    name: str | None = allowed("a name", "cache name under TREB_HOME/envs", default=None)
    python: str | None = allowed(
        'a version string such as "3.11"', "Python version of the venv", default=None
    )
    requirements: str | list[str] | None = allowed(
        "a file path or a list of requirement strings", "pip requirements", default=None
    )
    setup: str | None = allowed(
        "a path to a shell script", "runs inside the env after requirements", default=None
    )
    conda: CondaEnv | None = allowed(
        "a mapping", "build a conda prefix instead of a venv", default=None
    )
    image: str | None = allowed("a container image reference", "container image", default=None)
    mounts: list[str] = allowed(
        "a list of SRC:DST strings", "container mounts", default_factory=list
    )
    reuse: bool = allowed(
        "true or false", "reuse a built env while its inputs are unchanged", default=True
    )
    cleanup: bool = allowed("true or false", "remove the env after the run", default=False)
    bare_nodes_only: bool = allowed(
        "true or false",
        "build it only on engines whose nodes start bare (SkyPilot, Kubernetes); locally, "
        "on Slurm and on ssh hosts the ranks run in the submitting environment",
        default=False,
    )

    @model_validator(mode="after")
    def _combos(self) -> Environment:
        """Forms that cannot make sense are refused before anything is built."""
        if self.bare_nodes_only and self.image:
            raise ValueError(
                "@environment.bare_nodes_only|an image runs the same on every engine; "
                "bare_nodes_only is for a venv or conda env built on the nodes"
            )
        if self.image and self.conda:
            raise ValueError("@environment.image|cannot be combined with environment.conda")
        if self.image and (self.python or self.requirements or self.setup):
            raise ValueError(
                "@environment.image|python, requirements and setup do not apply to an image; "
                "bake them into the image"
            )
        if self.mounts and not self.image:
            raise ValueError("@environment.mounts|mounts need environment.image")
        if self.conda and self.python:
            raise ValueError("@environment.python|for conda, set environment.conda.python")
        if self.conda and not (self.conda.environment_file or self.conda.python):
            raise ValueError(
                "@environment.conda|needs environment_file or python (no way to create it)"
            )
        for m in self.mounts:
            if ":" not in m:
                raise ValueError(f"@environment.mounts|{m!r} is not SRC:DST[:ro]")
        return self


class Results(Block):
    """Where performance numbers come from (see docs/results.md)."""

    file: str | None = allowed(
        "a file name",
        "results CSV (model, performance, metric) a rank writes; default results.csv",
        default=None,
    )
    ranks: Literal["rank0", "sum", "mean"] = allowed(
        "one of rank0, sum, mean",
        "which ranks' `performance:` lines count, and how",
        default="rank0",
    )


class MetricsSpec(Block):
    """Which rank logs the node agent reads metrics from, and how (docs/metrics.md)."""

    ranks: Literal["all"] | list[Annotated[int, Field(ge=0)]] = allowed(
        'a list of ranks (integers >= 0) or "all"',
        "whose log lines are read for metrics ([] turns metrics off)",
        default_factory=lambda: [0],
    )
    prefix: str | None = allowed(
        "a string such as 'metrics:'",
        "key=value / key: value pairs after this marker on a line are metrics",
        default=None,
    )
    patterns: list[str] = allowed(
        "a list of regular expressions with named groups",
        "each named group of a matching line is a metric (the group `step`: the step)",
        default_factory=list,
    )

    @field_validator("patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        for p in v:
            if not set(_compiled(p).groupindex) - {"step"}:
                raise ValueError(f"{p!r} has no named group, e.g. (?P<loss>[0-9.]+)")
        return v

    progress: str | None = allowed(
        "a regular expression with the named groups step and (optional) total",
        "the first rank's progress: a matching line gives step and total "
        "(tqdm bars, `step N/M` and the HuggingFace Trainer are read without it)",
        default=None, max_length=1000,
    )  # fmt: skip

    @field_validator("progress")
    @classmethod
    def _progress(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "step" not in _compiled(v).groupindex:
            raise ValueError(f"{v!r} has no group named step, e.g. (?P<step>\\d+)/(?P<total>\\d+)")
        return v


class MlflowTracking(Block):
    """An MLflow tracking server (docs/tracking.md)."""

    uri: str | None = allowed(
        "an http:// or https:// URL", "tracking server (default: MLFLOW_TRACKING_URI)",
        default=None, pattern=r"^https?://\S+$",
    )  # fmt: skip
    experiment: str | None = allowed(
        "a name", "experiment (default: MLFLOW_EXPERIMENT_NAME, else the run name)",
        default=None, min_length=1, max_length=500,
    )  # fmt: skip
    enabled: bool = allowed(
        "true or false", "false: no MLflow run even when MLFLOW_TRACKING_URI is set",
        default=True,
    )  # fmt: skip


class WandbTracking(Block):
    """Weights & Biases: variables for the program's own `wandb.init()`."""

    project: str | None = allowed("a name", "WANDB_PROJECT", default=None, min_length=1)
    entity: str | None = allowed("a name", "WANDB_ENTITY", default=None, min_length=1)


class Tracking(Block):
    """Experiment trackers the run is logged to (docs/tracking.md)."""

    mlflow: MlflowTracking | None = allowed(
        "a mapping", "an MLflow run per run (a parent per sweep)", default=None
    )
    wandb: WandbTracking | None = allowed(
        "a mapping", "W&B run ids, names and groups for the ranks", default=None
    )


# Tracker credentials: secrets by name (`secrets:`), never a value written in the spec.
TRACKER_SECRETS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY")


# Set by the launcher for each process (the contract's names); a spec cannot override them.
LAUNCHER_VARS = frozenset((*RANK_NAMES, *NODE_NAMES))
CHECKPOINT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class LogPolicy(Block):
    """What a failed attempt's logs decide about retrying (as Determined's log_policies)."""

    name: str | None = allowed("a name", "shown in status when the policy matched", default=None)
    pattern: str = allowed("a regular expression", "searched in the failed attempt's rank logs")
    action: Literal["no_retry", "retry"] = allowed(
        "one of no_retry, retry", "no_retry: the failure is final; retry: retry even past `retries`"
    )
    max_retries: Int = allowed(
        f"an integer between 0 and {MAX_RETRIES}",
        "retry: at most this many extra attempts",
        default=3, ge=0, le=MAX_RETRIES,
    )  # fmt: skip

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        from trebuchet.runtime.watch.log_policies import unsafe_pattern

        why = unsafe_pattern(v)
        if why:
            raise ValueError(why)
        return v


class Spec(Block, SpecFacts):
    """A workload: what to run, on how many nodes and processes, with which software.

    The engine-neutral fields only: the model a spec is validated with is spec_model(),
    this class plus one block per engine that has options (`slurm:`, ...)."""

    # Only subclasses validate: building this one's validator would be wasted time.
    model_config = ConfigDict(defer_build=True)

    name: str = allowed(
        "a name matching [a-z0-9][a-z0-9._-]*",
        "run name (default: file stem)",
        pattern=NAME_RE,
        max_length=63,
    )
    command: str | list[str] = allowed(
        "a non-empty string (run by bash) or a non-empty list of strings (run as is)",
        "what every rank runs", expand=False,
    )  # fmt: skip
    workdir: str = allowed(
        "a directory path", "working directory, relative to the spec file", default=".",
        max_length=MAX_PATH,
    )  # fmt: skip
    launcher: Launcher = allowed(
        "one of native, torchrun, mpirun, horovod, none", "who starts the ranks", default="native"
    )
    nodes: Int = allowed(
        f"an integer between 1 and {MAX_NODES}, or MIN:MAX (elastic: MAX, down to MIN after "
        "lost nodes)",
        "number of nodes", default=1, ge=1, le=MAX_NODES,
    )  # fmt: skip
    min_nodes: Int | None = allowed(
        f"an integer between 1 and {MAX_NODES}",
        "the fewest nodes the run goes on with once nodes are lost and no spare is left "
        "(written as nodes: MIN:MAX; docs/recovery.md)",
        default=None, ge=1, le=MAX_NODES,
    )  # fmt: skip
    spare_nodes: Int = allowed(
        f"an integer between 0 and {MAX_NODES}",
        "nodes held beyond `nodes` that replace a lost or unhealthy one (Slurm: in the "
        "allocation; ssh: the hosts listed after the first `nodes`; docs/recovery.md)",
        default=0, ge=0, le=MAX_NODES,
    )  # fmt: skip
    procs_per_node: Int | None = allowed(
        f"an integer between 1 and {MAX_PROCS_PER_NODE}",
        "ranks per node (default: gpus_per_node, or 1)",
        default=None, ge=1, le=MAX_PROCS_PER_NODE,
    )  # fmt: skip
    gpus_per_node: Int = allowed(
        f"an integer between -1 and {MAX_GPUS_PER_NODE} (-1: all visible)", "GPUs per node",
        default=0, ge=-1, le=MAX_GPUS_PER_NODE,
    )  # fmt: skip
    env: dict[EnvName, EnvValue] = allowed(
        "a mapping of NAME: value (strings, numbers or booleans)",
        "extra environment",
        default_factory=dict,
    )
    secrets: list[EnvName] = allowed(
        "a list of environment variable names",
        "names passed from the submitting shell",
        default_factory=list,
    )
    environment: Environment | None = allowed(
        "a mapping", "software environment (omitted: the current one)", default=None
    )
    gpu_vendor: Literal["auto", "nvidia", "amd"] = allowed(
        "one of auto, nvidia, amd", "GPU vendor (auto: detected)", default="auto"
    )
    pre: str | None = allowed(
        "a shell command", "runs on each node, inside the environment, before the ranks",
        default=None, expand=False,
    )  # fmt: skip
    post: str | None = allowed(
        "a shell command", "runs on each node, inside the environment, after the ranks",
        default=None, expand=False,
    )  # fmt: skip
    retries: Int = allowed(
        f"an integer between 0 and {MAX_RETRIES}", "extra attempts after a failed one",
        default=0, ge=0, le=MAX_RETRIES,
    )  # fmt: skip
    max_attempts_without_progress: Int = allowed(
        f"an integer between 0 and {MAX_RETRIES}",
        "attempts in a row that keep no work (no checkpoint past the last one) end the run, "
        "whatever retries remain; 0: never (docs/goodput.md)",
        default=3, ge=0, le=MAX_RETRIES,
    )  # fmt: skip
    checkpoint_pattern: str | None = allowed(
        'a regular expression ("" turns it off)',
        "a rank's log line saying a checkpoint was saved counts as one (goodput, the "
        "no-progress rule); default: the HuggingFace Trainer's, Lightning's, Megatron's and "
        "DeepSpeed's lines; its group `step`, if any, is the number (docs/goodput.md)",
        default=None, max_length=1000,
    )  # fmt: skip
    straggler_threshold: float = allowed(
        "a number above 1, or 0 (off)",
        "a rank whose step times stay this many times its peers' median is named a "
        "straggler (docs/goodput.md#stragglers)",
        default=1.3,
    )

    @field_validator("checkpoint_pattern")
    @classmethod
    def _checkpoint_pattern(cls, v: str | None) -> str | None:
        if v:
            _compiled(v)
            from trebuchet.runtime.watch.marks import pattern_risk

            risk = pattern_risk(v)  # the agent runs it on every line a rank prints
            if risk is not None:
                raise ValueError(f"{v!r} may take exponential time on a line ({risk}); "
                                 "write it without nested repeats")  # fmt: skip
        return v

    @field_validator("straggler_threshold", mode="before")
    @classmethod
    def _straggler_threshold(cls, v: Any) -> Any:
        import math

        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("must be a number above 1, or 0 (off)")
        try:
            v = float(v)  # an integer of 400 digits: too large for one
        except OverflowError:
            raise ValueError("must be a number above 1, or 0 (off)") from None
        if not math.isfinite(v) or not (v == 0 or v > 1):
            raise ValueError("must be a number above 1, or 0 (off)")
        return v

    timeout: Duration | None = allowed(DURATION_ALLOWED, "per-attempt time limit", default=None)
    timeout_warning: Duration | None = allowed(
        DURATION_ALLOWED,
        "send checkpoint_signal this long before the timeout (default: min(60 s, 10%))",
        default=None,
    )
    grace_period: Duration = allowed(
        DURATION_ALLOWED, "between SIGTERM and SIGKILL when stopping ranks", default=5.0
    )
    hang_timeout: Duration | None = allowed(
        DURATION_ALLOWED,
        "the run is hung when no rank made progress (a log line, a heartbeat) for this long "
        "(off by default; docs/hangs.md)",
        default=None,
    )
    node_timeout: Duration = allowed(
        DURATION_ALLOWED,
        "a node is lost when its agents stay silent this long (their heartbeat: every 2 s); "
        "the attempt then ends with node_lost and the node's name (Slurm; docs/recovery.md)",
        default=10.0,
    )
    on_hang: Literal["fail", "retry", "warn"] = allowed(
        "one of fail, retry, warn",
        "on a hang, after the stacks of every rank: fail the run (reason hang), retry it "
        "(checkpoint signal, then teardown; counts against retries), or warn and go on",
        default="fail",
    )
    idle_gpu_timeout: Duration | None = allowed(
        DURATION_ALLOWED,
        "the GPUs are idle when none was busy (> 5% utilisation) for this long; needs "
        "gpus_per_node (off by default; docs/metrics.md)",
        default=None,
    )
    idle_gpu_action: Literal["warn", "fail"] = allowed(
        "one of warn, fail",
        "on idle GPUs: say so and go on, or fail the run (reason idle_gpu)",
        default="warn",
    )
    checkpoint_signal: str = allowed(
        "one of " + ", ".join(CHECKPOINT_SIGNALS),
        "signal that asks ranks to checkpoint (sent before a timeout)",
        default="SIGUSR2",
    )
    log_policies: list[LogPolicy] = allowed(
        "a list of {pattern, action} mappings",
        "checked first, before the default policies",
        default_factory=list,
    )
    default_log_policies: bool = allowed(
        "true or false", "also apply the shipped policies (CUDA OOM: no_retry, ...)", default=True
    )
    no_retry_exit_codes: list[ExitCode] = allowed(
        "a list of exit codes (integers between 0 and 255)",
        "a failure whose first failing process exited with one of these ends the run, "
        "whatever `retries` and the log policies say (docs/recovery.md)",
        default_factory=list, max_length=256,
    )  # fmt: skip
    retry_exit_codes: list[ExitCode] | None = allowed(
        "a list of exit codes (integers between 0 and 255)",
        "only a failure with one of these exit codes is retried (by `retries` and the log "
        "policies); any other ends the run (docs/recovery.md)",
        default=None, max_length=256,
    )  # fmt: skip
    health_check: str | None = allowed(
        "a shell command",
        "run in the workdir on every node before each attempt's ranks, with the rank "
        "contract's variables; non-zero: the node is unhealthy and excluded (docs/recovery.md)",
        default=None, expand=False,
    )  # fmt: skip
    health_check_timeout: Duration = allowed(
        DURATION_ALLOWED, "health_check fails when it runs longer than this", default=60.0
    )
    allow_nodes: NodeNames = allowed(
        'a list of node names (letters, digits, . _ -), or ["*"] for any',
        "nodes this run may use even where their history across runs says to avoid them "
        "(`treb nodes`; docs/nodes.md); a string is split at commas",
        default_factory=list, max_length=4096,
    )  # fmt: skip
    master_port: Int | None = allowed(
        "an integer between 1024 and 65535", "fixed MASTER_PORT", default=None, ge=1024, le=65535
    )
    profile: Literal["none", "nsys", "torch"] = allowed(
        "one of none, nsys, torch", "profiler", default="none"
    )
    profile_ranks: list[Annotated[Int, Field(ge=0, lt=MAX_WORLD)]] | None = allowed(
        "a list of ranks (integers >= 0)", "profile only these ranks (default: all)", default=None
    )
    snapshot: bool = allowed(
        "true or false", "run a copy of the workdir made at submission", default=True
    )
    snapshot_max_size: str = allowed(
        "a size such as 200MB or 2GB", "refuse a snapshot larger than this", default="200MB"
    )
    sweep: dict[str, list[str | int | float | bool]] | None = allowed(
        "a mapping of field path to a list of values, e.g. {env.LR: [0.1, 0.01]}",
        "launch the cross product of these overrides as separate runs of one sweep",
        default=None,
    )
    sweep_parallel: Int | None = allowed(
        f"an integer between 1 and {MAX_SWEEP_POINTS}",
        "at most this many runs of a sweep at once (local default 1)",
        default=None, ge=1, le=MAX_SWEEP_POINTS,
    )  # fmt: skip
    results: Results = allowed(
        "a mapping", "how performance results are collected", default_factory=Results
    )
    metrics: MetricsSpec = allowed(
        "a mapping", "metrics read from the rank logs (docs/metrics.md)",
        default_factory=MetricsSpec,
    )  # fmt: skip
    tracking: Tracking = allowed(
        "a mapping with mlflow and/or wandb", "experiment trackers (docs/tracking.md)",
        default_factory=Tracking,
    )  # fmt: skip
    ignore_checks: list[str] = allowed(
        "a list of preflight finding ids", "silence these `treb check` findings",
        default_factory=list,
    )  # fmt: skip
    notify: list[Webhook] = allowed(
        "a list of {url, on, secret} mappings",
        "webhooks told of the run's start, end, hang and log patterns (docs/notify.md)",
        default_factory=list, max_length=MAX_HOOKS,
    )  # fmt: skip

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> Any:
        # blank is what bash splits words on: a command of U+00A0 is bash's to refuse (127)
        if isinstance(v, str) and v.strip(" \t\n"):
            parts = [v]
        elif (
            isinstance(v, list) and v and all(isinstance(x, str) for x in v) and v[0].strip(" \t\n")
        ):
            parts = v
        else:
            raise ValueError("bad command")
        if any(len(x) > MAX_TEXT for x in parts) or len(parts) > MAX_TEXT:
            raise ValueError(f"longer than {MAX_TEXT} characters (or items)")
        return v

    @field_validator("pre", "post", "health_check")
    @classmethod
    def _hook(cls, v: str | None) -> str | None:
        if v is not None and len(v) > MAX_TEXT:
            raise ValueError(f"longer than {MAX_TEXT} characters")
        if v is not None and "\0" in v:
            raise ValueError("contains a NUL byte")
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        count = 1
        for values in (v or {}).values():
            count *= max(1, len(values))
            if count > MAX_SWEEP_POINTS:
                raise ValueError(f"more than {MAX_SWEEP_POINTS} points in the cross product")
        return v

    @field_validator("timeout", "timeout_warning", "grace_period", "hang_timeout",
                     "idle_gpu_timeout", "node_timeout", "health_check_timeout",
                     mode="before")  # fmt: skip
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @model_validator(mode="before")
    @classmethod
    def _node_range(cls, data: Any) -> Any:
        """`nodes: "2:4"` (torchrun's MIN:MAX) is nodes 4 and min_nodes 2."""
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), str):
            return data
        m = re.fullmatch(r"\s*([0-9]{1,7})\s*:\s*([0-9]{1,7})\s*", data["nodes"])
        if m is None:
            return data  # the field's own error
        if "min_nodes" in data:
            raise ValueError("@nodes|a range MIN:MAX, or min_nodes, not both")
        if not 1 <= int(m[1]) <= int(m[2]) <= MAX_NODES:
            raise ValueError(f"@nodes|MIN:MAX needs 1 <= MIN <= MAX <= {MAX_NODES}, got {m[0]}")
        return {**data, "nodes": int(m[2]), "min_nodes": int(m[1])}

    @field_validator("node_timeout")
    @classmethod
    def _node_timeout(cls, v: float) -> float:
        if v < 5:  # two missed heartbeats and a margin: less would lose busy nodes
            raise ValueError("must be at least 5s (the agents' heartbeat is every 2s)")
        return v

    @field_validator("snapshot_max_size")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_size(v)  # raises on a bad size
        return v

    @field_validator("checkpoint_signal", mode="before")
    @classmethod
    def _signal(cls, v: Any) -> Any:
        name = str(v).upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name not in CHECKPOINT_SIGNALS:
            raise ValueError("bad signal")
        return name

    @model_validator(mode="after")
    def _cross(self) -> Spec:
        for name in self.env:
            if name in LAUNCHER_VARS or name.startswith("TREB_"):
                raise ValueError(f"@env.{name}|is set by the launcher for each process")
        if "MASTER_PORT" in self.env:
            if self.master_port is not None:
                raise ValueError("@env.MASTER_PORT|set master_port or env.MASTER_PORT, not both")
            port = self.env["MASTER_PORT"]
            if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
                raise ValueError("@env.MASTER_PORT|must be a port number")
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"@min_nodes|{self.min_nodes} is more than nodes ({self.nodes})")
        if self.world_size > MAX_WORLD:
            raise ValueError(
                f"@nodes|{self.nodes} nodes x {self.ranks_per_node} ranks is more than "
                f"{MAX_WORLD} ranks"
            )
        for name in TRACKER_SECRETS:  # a literal credential would be written to disk
            value = self.env.get(name)
            if value is not None and not any("${" + s + "}" in value for s in self.secrets):
                raise ValueError(
                    f"@env.{name}|is a credential: list it under secrets, or set it to "
                    "${A_SECRET} (its value then comes from the submitting shell and is "
                    "never written)"
                )
        clash = sorted(set(self.secrets) & set(self.env))
        if clash:
            raise ValueError(
                f"@secrets|{clash[0]} is also set in env; "
                "a secret's value comes from the shell only"
            )
        return self


_built: tuple[int, type[Spec]] | None = None


def spec_model() -> type[Spec]:
    """The model a spec is validated with: Spec plus one field per engine block, as the
    engine registry has them now (rebuilt when an engine is registered)."""
    global _built
    from pydantic import create_model

    from trebuchet import registry

    blocks = registry.option_models()  # may register engines from entry points
    gen = registry.generation()
    if _built is None or _built[0] != gen:
        fields: dict[str, Any] = {
            name: (model, allowed("a mapping", _about(name, model), default_factory=model))
            for name, model in blocks
        }
        doc = (Spec.__doc__ or "").split("\n\n")[0]
        model = create_model("Spec", __base__=Spec, __module__=__name__, __doc__=doc, **fields)
        _built = (gen, model)
    return _built[1]


def _about(name: str, model: type[BaseModel]) -> str:
    doc = (model.__doc__ or "").strip().splitlines()
    return doc[0] if doc else f"{name}-specific settings"


def engine_blocks(model: type[BaseModel]) -> list[str]:
    """The fields of a spec model that are engine blocks."""
    return [name for name in model.model_fields if name not in Spec.model_fields]


def not_expanded(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Key paths whose values are shell commands, never ${VAR}-expanded (x-expand false)."""
    out: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("x-expand") is False:
            out.add(path)
        for cand in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                out |= not_expanded(cand, path)
    return out
