"""A Slurm run's state from what the job wrote (records) and what squeue says (one call).

Why both: the records in the run directory hold every rank's exit code, its node and why
each attempt ended, with or without accounting; squeue says whether the job still exists
(pending, requeued, completing) and, for a while after the end, how Slurm ended it.
Nothing here polls: `squeue_jobs` is one call for all the runs being refreshed.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from trebuchet.runtime.contracts.schema import Outcome
from trebuchet.runtime.rundir.records import read_json
from trebuchet.store.states import (
    CANCELLED,
    FAILED,
    PENDING,
    RETRYING,
    RUNNING,
    SUCCEEDED,
    TIMEOUT,
)

# squeue's long state names: still alive (the job may yet write records) ...
PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                  "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}  # fmt: skip
RUNNING_STATES = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
# ... or ended, with what that means for trebuchet (and why, for the attempt row).
ENDED_STATES = {
    "COMPLETED": (SUCCEEDED, None),
    "FAILED": (FAILED, "job failed"),
    "CANCELLED": (CANCELLED, "cancelled in Slurm"),
    "TIMEOUT": (TIMEOUT, "time limit"),
    "DEADLINE": (TIMEOUT, "deadline reached"),
    "NODE_FAIL": (FAILED, "node failure"),
    "BOOT_FAIL": (FAILED, "node boot failure"),
    "PREEMPTED": (FAILED, "preempted"),
    "OUT_OF_MEMORY": (FAILED, "out of memory"),
    "SPECIAL_EXIT": (FAILED, "special exit"),
    "REVOKED": (CANCELLED, "revoked (federation)"),
}
RECORD_RE = re.compile(r"^(rank|node|lost)-(\d+)\.json$")  # lost: runtime/job/link.py


@dataclass
class QueueInfo:
    """One job as squeue (or sacct) sees it."""

    state: str
    reason: str = ""  # squeue's %r: why a pending job waits (reasons.py)
    nodes: str = ""
    partition: str = ""
    time_limit: str = ""


@dataclass
class JobFiles:
    """Everything the job wrote into the run directory so far."""

    attempts: dict[int, dict[str, Any]] = field(default_factory=dict)
    records: dict[int, list[Outcome]] = field(default_factory=dict)
    result: dict[str, Any] | None = None

    @property
    def last_attempt(self) -> int | None:
        return max(self.attempts) if self.attempts else None


def _read(path: Path) -> dict[str, Any] | None:
    data = read_json(str(path))  # absent, not a regular file (a rank's FIFO), or no JSON
    return data if isinstance(data, dict) else None


def read_job_files(run_dir: Path) -> JobFiles:
    files = JobFiles(result=_read(run_dir / "result.json"))
    for adir in run_dir.glob("attempt-*"):
        try:
            n = int(adir.name.split("-", 1)[1])
        except ValueError:
            continue
        att = _read(adir / "attempt.json")
        if att is not None:
            files.attempts[n] = att
        recs: list[Outcome] = []
        for path in adir.glob("*.json"):
            if RECORD_RE.match(path.name):
                rec = _read(path)
                if rec is not None:
                    recs.append(cast("Outcome", rec))
        files.records[n] = recs
    return files


def parse_squeue(text: str) -> dict[str, QueueInfo]:
    """`squeue -h -o '%i|%T|%r|%N|%P|%l'` lines (or sacct's JobID|State) -> {job id: QueueInfo}."""
    jobs: dict[str, QueueInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            jobs[parts[0]] = QueueInfo(
                parts[1].split()[0].rstrip("+"), *(p.strip() for p in parts[2:6])
            )
    return jobs


def base_ids(job_ids: list[str]) -> list[str]:
    """Job ids to ask Slurm about: an array task (`123_4`) by its array's id (`123`)."""
    return sorted({j.split("_", 1)[0] for j in job_ids})


SQUEUE_TIMEOUT_S = 30.0  # squeue not answered by then: no answer (None), never a failure


def squeue_jobs(job_ids: list[str], timeout: float | None = None) -> dict[str, QueueInfo] | None:
    """One squeue call for all these jobs (finished ones too, while Slurm keeps them).

    None when squeue cannot answer (no Slurm here, controller down): then no run's state
    may be concluded from a job's absence."""
    if not job_ids:
        return {}
    # --array: one line per array task (`<job>_<task>`, a sweep point's backend_id), pending
    # ones too; an array is asked for once, by its job id.
    cmd = ["squeue", "--noheader", "--array", "--states=all",
           f"--jobs={','.join(base_ids(job_ids))}", "--format=%i|%T|%r|%N|%P|%l"]  # fmt: skip
    try:
        res = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=SQUEUE_TIMEOUT_S if timeout is None else timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        # One unknown id is an error ("Invalid job id specified"); it means: not there.
        if "Invalid job id" in res.stderr:
            return {}
        return None
    return parse_squeue(res.stdout)


def sacct_jobs(job_ids: list[str], timeout: float = 30.0) -> dict[str, QueueInfo]:
    """How Slurm ended jobs squeue forgot, where accounting is on; {} where it is not."""
    if not job_ids:
        return {}
    cmd = ["sacct", "--noheader", "--parsable2", "--allocations",
           f"--jobs={','.join(base_ids(job_ids))}", "--format=JobID,State"]  # fmt: skip
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if res.returncode != 0:
        return {}
    return parse_squeue(res.stdout)


def live_state(info: QueueInfo, files: JobFiles) -> str | None:
    """The run's state while its job is still in the queue or running; None once ended.
    The job controller's own result (source `batch`) ends the run even while Slurm still
    winds the job down: a lost node keeps it COMPLETING until Slurm gives up on the node."""
    if info.state in PENDING_STATES:
        return RETRYING if files.attempts else PENDING
    if info.state in RUNNING_STATES:
        decided = files.result is not None and files.result.get("source") == "batch"
        return None if decided else RUNNING
    return None


# A job that Slurm requeues (preemption, `scontrol requeue`) can show an ended state such as
# FAILED for a moment before it is PENDING again; see settling().
REQUEUE_SETTLE_S = 15.0


def settling(files: JobFiles, info: QueueInfo, now: float, cancel_requested: bool) -> bool:
    """Is it too early to end a run on Slurm's word? Only when Slurm contradicts what the
    job's own SIGTERM trap guessed, a few seconds after it: that is what a requeue looks like
    from outside, and the run must then become RETRYING, not FAILED."""
    result = files.result or {}
    slurm = ENDED_STATES.get(info.state)
    if cancel_requested or result.get("source") != "signal" or slurm is None:
        return False
    if slurm[0] == result.get("state"):
        return False
    ended = result.get("ended_at")
    return isinstance(ended, (int, float)) and now - ended < REQUEUE_SETTLE_S


def final_state(files: JobFiles, info: QueueInfo | None, job_id: str) -> tuple[str, str | None]:
    """(state, reason) of a run whose job has left the queue."""
    result = files.result
    slurm = ENDED_STATES.get(info.state) if info else None
    if result and result.get("state") in (SUCCEEDED, FAILED, TIMEOUT, CANCELLED):
        guessed = result.get("source") == "signal"  # from inside the job, at SIGTERM
        if guessed and slurm and slurm[0] not in (SUCCEEDED, result["state"]):
            return slurm  # Slurm knows better (preempted, node failure)
        return str(result["state"]), result.get("reason")
    if slurm and info is not None:  # slurm: from info
        return slurm[0], f"{slurm[1] or 'completed'} (Slurm state {info.state}; " \
            "the job left no result record)"  # fmt: skip
    return "LOST", (
        f"job {job_id} left the queue without an outcome record: is TREB_HOME on a "
        "filesystem the nodes share, and did the job start at all? (see batch.log)"
    )


CANCEL_WAIT_ENV = "TREB_SLURM_CANCEL_WAIT_S"


def cancel_wait_s() -> float:
    """How long `treb cancel` waits for Slurm to say a cancelled job ended (TREB_SLURM_CANCEL_
    WAIT_S, default 60 s): read before anything is signalled, so a value that is no finite
    number of seconds >= 0 is a named error (exit 2), never a traceback after the signal
    or a wait that never ends (nan, inf)."""
    import math
    import os

    from trebuchet.errors import UserError

    raw = os.environ.get(CANCEL_WAIT_ENV, "60")
    try:
        wait = float(raw)
    except ValueError:
        wait = math.nan
    if not math.isfinite(wait) or wait < 0:
        raise UserError(f"{CANCEL_WAIT_ENV}={ascii(raw)[:80]}: not a number of seconds >= 0 "
                        "(unset it for the default, 60)")  # fmt: skip
    return wait
