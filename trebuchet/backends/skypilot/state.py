"""SkyPilot runs after hand-over: their states from SkyPilot's own API, polled in batches
(tested on its own with a stand-in `sky` module, as slurm/state.py for Slurm).
"""

from __future__ import annotations

from typing import Any

from trebuchet.store import lifecycle
from trebuchet.store.states import (
    CANCELLED,
    FAILED,
    LOST,
    PENDING,
    RETRYING,
    RUNNING,
    SUCCEEDED,
)

# SkyPilot's job statuses (sky.jobs.ManagedJobStatus, sky.skylet.job_lib.JobStatus) -> ours.
MANAGED_STATES = {
    "PENDING": PENDING, "DEPRECATED_SUBMITTED": PENDING, "STARTING": PENDING,
    "RUNNING": RUNNING, "WINDING_DOWN": RUNNING, "CANCELLING": RUNNING,
    "RECOVERING": RETRYING, "SUCCEEDED": SUCCEEDED, "CANCELLED": CANCELLED,
}  # fmt: skip
CLUSTER_STATES = {
    "INIT": PENDING, "PENDING": PENDING, "SETTING_UP": PENDING, "RUNNING": RUNNING,
    "SUCCEEDED": SUCCEEDED, "CANCELLED": CANCELLED,
}  # fmt: skip


def _field(row: Any, key: str) -> Any:
    """A key of a SkyPilot record, whether it comes as a dict or as a model."""
    return row.get(key) if isinstance(row, dict) else getattr(row, key, None)


def _name(status: Any) -> str | None:
    return None if status is None else str(getattr(status, "name", status))


def _state(table: dict[str, str], status: str | None, reason: Any) -> tuple[str, str | None]:
    if status is None:
        return LOST, "SkyPilot no longer knows this job"
    if status.startswith("FAILED"):
        return FAILED, f"SkyPilot: {status}" + (f": {reason}" if reason else "")
    return table.get(status, RUNNING), None


def refresh_runs(backend: str, store: Any, runs: list[Any]) -> None:
    """One `sky.jobs.queue` call for all managed jobs, one `sky.job_status` per cluster."""
    active = [r for r in runs if r.active and r.backend == backend and r.backend_id]
    if not active:
        return
    try:
        import sky
    except ImportError:  # nothing can be concluded without SkyPilot
        return
    managed: dict[int, Any] = {}
    clusters: dict[str, dict[int, Any]] = {}
    for rec in active:
        kind, _, job = rec.backend_id.rpartition(":")
        if not job.isdigit():
            continue
        if kind == "jobs":
            managed[int(job)] = rec
        else:
            clusters.setdefault(kind.removeprefix("cluster:"), {})[int(job)] = rec
    if managed:
        _follow_managed(sky, store, managed)
    for cluster, jobs in clusters.items():
        _follow_cluster(sky, store, cluster, jobs)


def _follow_managed(sky: Any, store: Any, managed: dict[int, Any]) -> None:
    try:
        got = sky.get(sky.jobs.queue(refresh=False, job_ids=sorted(managed)))
    except Exception:  # API server unreachable: conclude nothing
        return
    rows = got[0] if isinstance(got, tuple) else got
    seen = {int(_field(r, "job_id")): r for r in rows or []}
    for job, rec in managed.items():
        row = seen.get(job)
        status = _name(_field(row, "status")) if row is not None else None
        reason = _field(row, "failure_reason") if row is not None else None
        lifecycle.follow(store, rec.id, *_state(MANAGED_STATES, status, reason))


def _follow_cluster(sky: Any, store: Any, cluster: str, jobs: dict[int, Any]) -> None:
    try:
        got = sky.get(sky.job_status(cluster, sorted(jobs)))
    except Exception as exc:  # down=True: the cluster goes when its job ends
        if "not exist" in str(exc) or "not up" in str(exc).lower():
            for rec in jobs.values():
                why = f"cluster {cluster} is gone before its job's end was seen (it is torn down "
                lifecycle.follow(store, rec.id, LOST, why + "after the job: down=True)")
        return
    for job, rec in jobs.items():
        lifecycle.follow(store, rec.id, *_state(CLUSTER_STATES, _name((got or {}).get(job)), None))
