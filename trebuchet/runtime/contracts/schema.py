"""What trebuchet's processes hand each other: the job file, the records in the run
directory, and the run's states with the moves between them.

These are written on one machine and read on another (the nodes' runtime ships without the
package), so their shape is the contract between versions. Fields in a `total=False` part
may be absent from a file: readers use .get().
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Any, TypedDict
else:

    class TypedDict(dict):
        """At run time a record below is a plain dict, as typing's TypedDict makes it; but
        typing's compiles each field's annotation when the class is made (~150 fields:
        ~3 ms of every launch, on the path to the first rank), for the type checker alone."""

        def __new__(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(*args, **kwargs)

        def __init_subclass__(cls, total: bool = True, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)


# A run's state moves among the active ones until one of TERMINAL, which is final: the run
# index refuses any other state after it (store/db.py), whoever asks.
TERMINAL = ("SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "LOST")
ACTIVE = ("PENDING", "RUNNING", "RETRYING")
RETRIABLE = ("FAILED", "TIMEOUT")  # the attempt states a next attempt may follow
TRANSITIONS = {state: tuple(s for s in ACTIVE + TERMINAL if s != state) for state in ACTIVE}

# The run's events a `notify:` webhook may ask for (runtime/publish/webhooks.py), besides `log:`.
NOTIFY_EVENTS = ("started", "succeeded", "failed", "hung", "cancelled", "timeout", "straggler")


def allowed(old: str, new: str) -> bool:
    return old == new or new in TRANSITIONS.get(old, ())


class LogPolicy(TypedDict, total=False):
    name: str
    pattern: str
    action: str  # "retry" or "no_retry"
    max_retries: int


class _JobCommon(TypedDict):
    run_id: str
    launcher: str  # native, torchrun, mpirun, horovod, none
    nodes: int
    ppn: int
    command: list[str]
    grace: float  # seconds from the stop signal to SIGKILL (a whole number: an int)
    checkpoint_signal: str  # e.g. "SIGUSR2"
    secrets: list[str]  # names only: values come from the node's environment
    spec_env: list[str]


class JobFile(_JobCommon, total=False):
    """The one description of an attempt, on every engine (backends/job_file.py writes it,
    runtime/job/life.py `settings()` reads it); the optional part, then each engine's extras."""

    hang_timeout: float
    on_hang: str
    node_timeout: float  # a node whose agents stay silent this long is lost
    spare_nodes: int  # nodes held beyond `nodes` (runtime/job/nodeset.py)
    min_nodes: int  # the fewest nodes an attempt may run on (nodes: MIN:MAX)
    no_retry_exit_codes: list[int]  # runtime/job/retry_codes.py
    retry_exit_codes: list[int]
    health_check: str  # the spec's own node check (runtime/node/health.py)
    health_check_timeout: float
    gpus_per_node: int  # the GPUs a node's health check must see (when > 0)
    metrics: dict[str, Any]
    timeout: float | None  # one attempt, seconds
    warning: float | None  # the checkpoint signal this long before the timeout
    checkpoint_dir: str
    secret_env: dict[str, str]
    profile: str | None
    profile_ranks: list[int] | None
    # the job controller's (every engine that runs one: local, ssh, Slurm)
    run_dir: str
    max_attempts: int  # retries + 1
    policies: list[LogPolicy]
    pre: str
    post: str
    nodes_watch: bool  # the node agents hold the hang watch and the warning (ssh), not it
    # Slurm's (backends/slurm/script.py)
    workdir: str
    requeue_margin: float
    master_port: int | None
    srun: list[str]
    srun_hook: list[str]
    mpi_env: list[str]
    inline: bool
    horovod: HorovodHosts  # launcher horovod over ssh (runtime/node/horovodrun.py)
    plan: LocalPlan  # every process, computed at submission (the local engine's, plan.py)


class ProcPlan(TypedDict):
    label: str
    node: int
    rank: int | None
    local_rank: int | None
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str


class LocalPlan(TypedDict):
    """Every process's argv and environment, computed once at submission (`treb render`)."""

    procs: list[ProcPlan]
    streams: list[list[str]]  # [label, log file name]
    hooks: dict[str, list[ProcPlan]]  # the spec's pre and post command on each node
    master_addr: str
    master_port: int
    port_auto: bool  # a fresh free port per attempt (a fixed master_port is kept)
    environment: dict[str, Any] | None  # an envs.recipe.Recipe as JSON
    path_prepend: list[str]


class HorovodHosts(TypedDict, total=False):
    hosts: list[str]
    port: int | None
    identity: str | None


class Outcome(TypedDict, total=False):
    """`attempt-N/rank-R.json` (or node-N, pre-N): RUNNING, then ENDED (runtime/node/agent.py)."""

    label: str  # "rank 3", "node 0", "pre: node 1"
    rank: int | None
    node: int | None
    local_rank: int | None
    pid: int | None
    exit_code: int | None  # 128 + n for signal n, as a shell says it
    signal: str | None
    started_at: float | None
    ended_at: float | None
    stopped_by_launcher: bool  # a cascade: stopped by its launcher, the teardown or engine
    state: str  # RUNNING or ENDED
    log: str
    host: str
    attempt: int
    job_id: str
    step_id: str
    message: str | None  # a cause's (below)
    after_first_failure: bool  # a node lost once the attempt had failed: never the cause
    after_peer: bool  # its failure says another rank's came first (horovod's shutdown)
    left_first: bool  # a first failure the launcher stopped in its own exit (records.py)


FirstFailure = Outcome  # or a cause no process says, with `message` (rundir/records.cause)


class AttemptRecord(TypedDict, total=False):
    attempt: int
    state: str
    reason: str
    started_at: float | None
    ended_at: float | None
    source: str  # who decided: "batch" (the controller), "requeue", ...
    job_id: str
    restart_count: int
    nodes: str  # Slurm's nodelist
    master: str  # MASTER_ADDR:MASTER_PORT
    srun_exit: int | None
    max_attempts: int


class Result(TypedDict, total=False):
    state: str
    reason: str
    source: str
    attempt: int
    exit_code: int | None
    ended_at: float
    job_id: str
    failed_attempt: int  # cancelled with this attempt's retry pending: its failure is the cause


class Habit(TypedDict):
    count: int  # how many times its progress advanced
    first: float
    last: float
    gap: float | None  # the median gap between its progress times (None before two)


class Hang(TypedDict, total=False):
    attempt_dir: str
    hang_timeout: float
    action: str  # on_hang: fail, retry, warn
    last_progress: float
    detected_at: float
    expected: list[str]
    stacks_requested_at: float
    stacks_at: float
    stacks: list[str]
    missing_stacks: list[str]
    habits: dict[str, Habit]  # each rank's pace before the hang (older files: none)
