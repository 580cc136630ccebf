"""What `treb diagnose` says of a Slurm run that ended with no process's failure record
(SlurmBackend.explain_ending): a job sbatch refused (what it asked for, and what the
partitions have now), or a job that left the queue without an outcome (what to check).

Plain data back, as base.Backend.explain_ending describes it: the categories and the
remedies every engine shares are diagnose/catalog.py's, which this module does not import.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trebuchet.runtime.rundir.regular import open_regular, read_text

# The start of the reason call_sbatch (engine.py) records for a refused job or job array.
REFUSED = "sbatch refused"
# #SBATCH lines every job has: not what the user asked for.
PLUMBING = ("--output", "--open-mode", "--job-name", "--no-requeue", "--requeue", "--signal")
JOB_LOST = (
    "Find out what became of the job: `sacct -j JOB` where accounting is on, the slurmctld log "
    "(a controller restarted without its saved state forgets its jobs, and scancel, node "
    "failures or a purge can too), and batch.log in the run directory (absent or empty: the "
    "job never started, or TREB_HOME is not on a filesystem the nodes share). Then resubmit; "
    "retries: with checkpoints rides such losses out."
)


def explain(run: dict[str, Any]) -> dict[str, Any] | None:
    state, reason = run.get("state"), str(run.get("reason") or "")
    if state == "FAILED" and reason.startswith(REFUSED):
        return refused(run)
    if state == "LOST":
        return lost(run)
    return None


def refused(run: dict[str, Any]) -> dict[str, Any]:
    """sbatch refused the job: what it asked for (its #SBATCH lines) and what the
    partitions have (sinfo, now: the user fixes the spec against what exists when they
    read this)."""
    from trebuchet.backends.slurm.checks import partitions

    reason = str(run.get("reason"))  # "sbatch refused the job[ array]: sbatch: error: ..."
    what, _, said = reason.partition(": ")
    why = said.rsplit("Batch job submission failed: ", 1)[-1].rsplit("error: ", 1)[-1]
    try:
        script = read_text(Path(run["run_dir"]) / "submit.sbatch").splitlines()  # regular only
    except (OSError, KeyError):
        script = []
    asked = [ln.split(None, 1)[1] for ln in script if ln.startswith("#SBATCH ")]
    asked = [a for a in asked if not a.startswith(PLUMBING)]
    evidence = [reason]
    if asked:
        evidence.append("the job asked for: " + " ".join(asked))
    parts = partitions(os.environ)
    here = "partitions here, as sinfo says: " + "; ".join(parts) if parts else None
    return {"category": "scheduler_refusal", "summary": f"{what}: {why}", "evidence": evidence,
            "resources": here}  # fmt: skip


def lost(run: dict[str, Any]) -> dict[str, Any]:
    """The job left Slurm's queue without an outcome record (the attempt's reason says what
    to check), or the run never reached sbatch."""
    job = run.get("backend_id")
    reason = run.get("reason") or ""
    evidence = [f"attempt {int(run.get('attempt') or 0) + 1}: {reason}"] if reason else []
    if not job:
        summary = ("the run never reached sbatch (treb run was stopped before submitting "
                   "it): no Slurm job ran")  # fmt: skip
        return {"category": "node_failure", "summary": summary, "evidence": evidence}
    batch = _last_lines(Path(run["run_dir"]) / "batch.log")
    if batch is None:
        evidence.append("batch.log: absent (the job never started, or wrote elsewhere)")
    else:
        evidence += [f"batch.log: {ln}" for ln in batch[-3:]] or ["batch.log: empty"]
    summary = (
        f"Slurm job {job} left the queue without an outcome record: Slurm no longer knows "
        "it (squeue, sacct) and the job wrote no result into the run directory"
    )
    return {"category": "node_failure", "summary": summary, "evidence": evidence,
            "fix": JOB_LOST.replace("JOB", str(job))}  # fmt: skip


def _last_lines(path: Path, n: int = 5, tail: int = 4096) -> list[str] | None:
    """The file's last `n` non-blank lines, from its last `tail` bytes (a partial first line
    dropped); None when it is not a file."""
    try:
        with open_regular(path) as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - tail))
            data = fh.read()
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()
    return [ln for ln in (lines[1:] if size > tail else lines) if ln.strip()][-n:]
