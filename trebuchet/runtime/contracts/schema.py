"""What trebuchet's processes hand each other, in one place: the job file an engine ships
to its nodes, the records the agents and the job controller write into the run directory,
the events of events.jsonl, and the run and attempt states with the moves between them.

Why here: these are read on one machine and written on another (the run index on the
submitting host, the agents and the Slurm controller on the nodes, in the runtime that
ships without the package), so their shape is the contract between versions. Stdlib only
(Python >= 3.8): the runtime imports it on the nodes; the run index (store/) checks the
same states. Fields in a `total=False` part may be absent from a file: readers use .get().
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import TypedDict
else:

    class TypedDict(dict):
        """At run time a record below is a plain dict, as typing's TypedDict makes it; but
        typing's compiles each field's annotation when the class is made (~150 fields:
        ~3 ms of every launch, on the path to the first rank), for the type checker alone."""

        def __new__(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(*args, **kwargs)

        def __init_subclass__(cls, total: bool = True, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)


# -- States ---------------------------------------------------------------------------
# A run's state moves among the active ones (an engine may queue a running job again:
# PENDING) until one of TERMINAL, which is final: the run index refuses any other state
# after it (store/db.py), whoever asks.
TERMINAL = ("SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "LOST")
ACTIVE = ("PENDING", "RUNNING", "RETRYING")
# The attempt states a next attempt may follow; any other (SUCCEEDED, CANCELLED, LOST) ends
# the run.
RETRIABLE = ("FAILED", "TIMEOUT")
TRANSITIONS = {state: tuple(s for s in ACTIVE + TERMINAL if s != state) for state in ACTIVE}
# An attempt's states: RUNNING, then one of these (its run may go on after the first two).
ATTEMPT_ENDS = ("FAILED", "TIMEOUT", "SUCCEEDED", "CANCELLED", "LOST")


# The run's events a `notify:` webhook may ask for (runtime/publish/webhooks.py), besides `log:`.
NOTIFY_EVENTS = ("started", "succeeded", "failed", "hung", "cancelled", "timeout", "straggler")


def allowed(old: str, new: str) -> bool:
    """Whether a run may move from state `old` to `new` (staying is always allowed)."""
    return old == new or new in TRANSITIONS.get(old, ())


# -- The job file (job.json) ------------------------------------------------------------
class LogPolicy(TypedDict, total=False):
    """One of the spec's log policies (or a default one), as the controller applies it."""

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
    """The one description of an attempt: what every engine hands its job controller and
    node agents (backends/job_file.py writes it, `settings()` in runtime/job/life.py reads
    it). The optional part: what is set only when the spec sets it, the node verb's secret
    env and profiling (SkyPilot, Kubernetes, ssh), and each engine's extras (typed below)."""

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
    """One process the local supervisor starts (a rank, or a per-node launcher)."""

    label: str
    node: int
    rank: int | None
    local_rank: int | None
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str


class LocalPlan(TypedDict):
    """What the local engine adds: every process's argv and environment, computed once
    at submission (`treb render --on local` shows them)."""

    procs: list[ProcPlan]
    streams: list[list[str]]  # [label, log file name]
    hooks: dict[str, list[ProcPlan]]  # the spec's pre and post command on each node
    master_addr: str
    master_port: int
    port_auto: bool  # a fresh free port per attempt (a fixed master_port is kept)
    environment: dict[str, Any] | None  # an envs.recipe.Recipe as JSON
    path_prepend: list[str]


class HorovodHosts(TypedDict, total=False):
    """Where node 0's horovodrun reaches the hosts: their addresses, ssh port, identity."""

    hosts: list[str]
    port: int | None
    identity: str | None


# -- Records in the run directory ----------------------------------------------------
class Outcome(TypedDict, total=False):
    """A process's record, `attempt-N/rank-R.json` (or `node-N.json`, `pre-N.json`): RUNNING
    while it runs, ENDED with its exit; the agent writes it (runtime/node/agent.py)."""

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


# The run's first failure: the failing process's Outcome, or a cause no process says
# (runtime/records.cause: an environment build, a full disk, an ssh connection), with
# `message`; the index keeps it with the attempt it ended and its log.
FirstFailure = Outcome


class AttemptRecord(TypedDict, total=False):
    """`attempt-N/attempt.json`, by the Slurm job controller: how an attempt went."""

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
    """`result.json`, by the Slurm job controller: the run's end (read by `treb status`)."""

    state: str
    reason: str
    source: str
    attempt: int
    exit_code: int | None
    ended_at: float
    job_id: str
    failed_attempt: int  # cancelled with this attempt's retry pending: its failure is the cause


class Habit(TypedDict):
    """A rank's progress as the hang watch saw it (runtime/hang.py Habits)."""

    count: int  # how many times its progress advanced
    first: float
    last: float
    gap: float | None  # the median gap between its progress times (None before two)


class Hang(TypedDict, total=False):
    """`attempt-N/hang.json`: a hang the watch found, and whose stacks came in."""

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


# -- Events (events.jsonl) --------------------------------------------------------------
# One JSON object a line: `time` and `event`, then the event's fields. run_started,
# attempt_started, retrying, run_ended, lost, failed, state and an engine's refused
# submission (`<engine>_failed` with a reason) change the run's state: store/lifecycle.py
# writes them and the index follows, store/rebuild.py replays them the same way. The others
# are there to be read (attempt_ended, log_policy, hang, teardown, timeout_warning, ...).


class Event(TypedDict, total=False):
    time: float
    event: str
    state: str  # run_ended, attempt_ended, state, failed, lost
    attempt: int
    reason: str
    backend: str  # submitted
    backend_id: str  # the engine's id of the job (Slurm job id, namespace/job, ...)
    pid: int  # run_started: the supervisor's pid, start time and host
    start: float | None
    host: str
    error: str  # environment_failed, sbatch_failed
