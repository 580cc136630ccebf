"""The job controller's records on Slurm, what `treb` reads without sacct: batch.log (the
batch step's output), events.jsonl, `attempt-<n>/attempt.json`, `result.json` and the log
policies' grants (`policy-retries`, kept across a requeue). BatchRecords is the Records of
runtime/job/life.py on Slurm, and holds the attempt they describe (its number, folder,
start, the step's exit, its state and reason); the Controller (step.py) reads and sets
those through it (Field).

Stdlib only, Python >= 3.8: it ships in the runtime file.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from ..job.life import max_attempts
from ..publish import trackers as tracking
from ..rundir.records import append_event, now, write_json, write_text
from ..rundir.regular import read_text
from ..watch import hung as hang

if TYPE_CHECKING:
    from ..contracts.schema import AttemptRecord, FirstFailure, Hang, JobFile, Result

T = TypeVar("T")


def log(text: str) -> None:
    """A line of batch.log (Slurm's --output of the batch step)."""
    print(f"[treb {time.strftime('%H:%M:%S')}] {text}", flush=True)


class BatchRecords:
    """The records of a Slurm job's attempts, and the attempt they describe."""

    def __init__(self, job: JobFile, ending: Callable[[], bool]) -> None:
        self.job = job
        self.run_dir: str = job["run_dir"]
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.ending = ending  # Slurm is ending the job: on_term wrote result.json
        self.attempt = 0
        self.adir = ""
        self.t0: float | None = None
        self.step_rc: int | None = None  # the attempt's srun step exit (or inline agent's)
        self.state, self.reason = "", ""
        self.use: list[str] = []  # this attempt's nodes (nodeset.choose): the master first
        self.granted_by: dict[str, int] = {}  # the job controller's (its log policies')
        self.failed_attempt: int | None = None  # a cancel ended this attempt's pending retry

    def granted(self) -> dict[str, int]:
        """The retries each log policy granted so far, kept in `policy-retries` (one name a
        line) so that a requeued job keeps the count."""
        try:  # a regular file only: the run directory is the ranks' too
            used = read_text(os.path.join(self.run_dir, "policy-retries"), 1 << 20).splitlines()
        except OSError:
            used = []
        return {name: used.count(name) for name in set(used)}

    def attempts_allowed(self) -> int:
        """retries + 1 and the attempts the log policies granted so far."""
        return max_attempts(int(self.job["max_attempts"]) - 1, self.granted_by)

    def max_attempts(self, count: int, granted: dict[str, int]) -> None:
        """Records: the log policies' grants, kept in `policy-retries` (one name a line) so
        that a requeued job keeps the count."""
        text = "".join(f"{name}\n" * n for name, n in sorted(granted.items()))
        write_text(os.path.join(self.run_dir, "policy-retries"), text)

    def attempt_json(self, state: str, reason: str, ended: float | None, source: str) -> None:
        master = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
        record: AttemptRecord = {
            "attempt": self.attempt, "state": state, "reason": reason, "started_at": self.t0,
            "ended_at": ended, "source": source, "job_id": self.job_id,
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "nodes": ",".join(self.use) or os.environ.get("SLURM_JOB_NODELIST", ""),
            "master": master,
            "srun_exit": self.step_rc, "max_attempts": self.attempts_allowed(),
        }  # fmt: skip
        write_json(os.path.join(self.adir, "attempt.json"), record)

    def result(self, state: str, reason: str, source: str) -> None:
        end: Result = {"state": state, "reason": reason, "source": source,
                       "attempt": self.attempt, "exit_code": self.step_rc, "ended_at": now(),
                       "job_id": self.job_id}  # fmt: skip
        if state == "CANCELLED" and self.failed_attempt is not None:
            end["failed_attempt"] = self.failed_attempt  # its failure: the run's cause
        write_json(os.path.join(self.run_dir, "result.json"), end)
        # The MLflow run's status now, also when nobody follows the job (bounded: a
        # server that does not answer costs 2 x END_TIMEOUT_S, an event, nothing else).
        tracking.mark(self.run_dir, state, reason)

    def die(self, why: str) -> int:
        """The job cannot start: say why where `treb status` finds it."""
        log(f"error: {why}")
        self.result("FAILED", why, "batch")
        return 2

    # -- Records (runtime/job/life.py) ----------------------------------------------------
    def say(self, text: str) -> None:
        log(text)

    def event(self, kind: str, **fields: Any) -> None:
        if kind == "retry_cancelled":  # job/life.py: the cancel came with a retry pending
            self.failed_attempt = int(fields["attempt"])
        append_event(self.run_dir, kind, **fields)

    def attempt_started(self, attempt: int, started_at: float, **facts: Any) -> None:
        self.attempt = attempt
        self.adir = os.path.join(self.run_dir, f"attempt-{attempt}")
        os.makedirs(self.adir, mode=0o700, exist_ok=True)
        os.environ["TREB_ATTEMPT"] = str(attempt)
        self.t0, self.step_rc = started_at, None
        self.attempt_json("RUNNING", "", None, "batch")
        log(
            f"attempt {attempt + 1} of {self.attempts_allowed()}: "
            f"{len(self.use) or self.job['nodes']} node(s) "
            f"{','.join(self.use) or os.environ.get('SLURM_JOB_NODELIST', '')}, master "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        )

    def attempt_stopped(self, attempt: int, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        if not self.ending():
            self.attempt_json(state, reason, now(), "batch")

    def attempt_ended(self, attempt: int, state: str, reason: str | None) -> None:
        self.state, self.reason = state, reason or ""
        self.attempt_json(state, self.reason, now(), "batch")

    def first_failure(self, cause: FirstFailure) -> None:
        """The agents' records say it; `treb` reads them (slurm_state.py)."""

    def hang(self, attempt: int, info: Hang, action: str) -> None:
        log(f"{hang.describe(info)}; on_hang: {action}")

    def log_policy(self, attempt: int, name: str, action: str, line: str) -> None:
        log(f"log policy {name} ({action}) matched: {line}")
        append_event(self.run_dir, "log_policy", attempt=attempt, policy=name, action=action,
                     line=line)  # fmt: skip
        self.reason = f"{name}: {action}"
        self.attempt_json(self.state, self.reason, now(), "batch")

    def retrying(self, attempt: int) -> None:
        """Said in batch.log by the controller; the next attempt.json follows."""

    def run_ended(self, state: str, cause: FirstFailure | None, exit_code: int,
                  reason: str | None = None) -> None:  # fmt: skip
        if self.ending():  # on_term wrote result.json when Slurm began ending the job
            return
        self.state = state
        self.reason = reason or self.reason
        self.result(state, self.reason, "batch")
        run = self.job["run_id"]
        log(f"run {run}: {state}" + (f" ({self.reason})" if self.reason else ""))

    def heartbeat(self) -> None:
        """`treb` follows the job through squeue and these files: nothing to beat."""


class Field(Generic[T]):
    """An attribute of the Controller kept in its BatchRecords (`self.rec`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> T:
        return getattr(obj.rec, self.name)  # type: ignore[no-any-return]

    def __set__(self, obj: Any, value: T) -> None:
        setattr(obj.rec, self.name, value)
