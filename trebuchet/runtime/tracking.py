"""A run's experiment trackers as the processes that run it see them (docs/tracking.md).

The submitting side creates the tracker's run and writes `<run dir>/tracking.json` (ids
and URIs only, never a credential: tokens stay in the environment, as secrets do). From
it every process that starts ranks (the local supervisor, the Slurm job controller)
gives the ranks MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_ID / MLFLOW_RUN_ID and the
WANDB_* variables, so a script's own `mlflow.start_run()` or `wandb.init()` continues the
same run on every attempt and requeue, and whoever sees the end of the run records the
final status (`end`). A tracker that does not answer costs a bounded wait, an event in
events.jsonl and nothing else.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .mlflow_rest import STATUS, Mlflow, MlflowError
from .records import append_event, read_json

FILE = "tracking.json"
END_TIMEOUT_S = 3.0  # per request when the run has ended (Slurm's KillWait is 30 s)


def load(run_dir: str) -> dict[str, Any] | None:
    info = read_json(os.path.join(run_dir, FILE))
    return info if isinstance(info, dict) else None


def rank_env(info: dict[str, Any] | None) -> dict[str, str]:
    """The trackers' variables every rank gets (the spec's own env wins over them)."""
    out: dict[str, str] = {}
    ml = (info or {}).get("mlflow")
    if ml:
        out["MLFLOW_TRACKING_URI"] = ml["uri"]
        out["MLFLOW_EXPERIMENT_ID"] = str(ml["experiment_id"])
        out["MLFLOW_RUN_ID"] = ml["run_id"]
    wb = (info or {}).get("wandb")
    if wb:
        out["WANDB_RUN_ID"] = wb["run_id"]
        out["WANDB_RESUME"] = "allow"
        out["WANDB_NAME"] = wb["name"]
        for key, name in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY"),
                          ("group", "WANDB_RUN_GROUP")):  # fmt: skip
            if wb.get(key):
                out[name] = str(wb[key])
    return out


def mark(run_dir: str, state: str, reason: str = "", timeout: float = END_TIMEOUT_S) -> bool:
    """Record `state` (trebuchet's) on the run's MLflow run: its status (FINISHED, FAILED,
    KILLED; RUNNING again for a requeued job) and the tags treb.state / treb.reason.
    False (and a `tracking_failed` event) when the server did not take it."""
    info = load(run_dir)
    ml = (info or {}).get("mlflow")
    if not ml:
        return True
    client = Mlflow(ml["uri"], timeout=timeout)
    tags = [("treb.state", state)] + ([("treb.reason", reason)] if reason else [])
    try:
        client.log_batch(ml["run_id"], tags=tags)
        if state in ("RUNNING", "RETRYING"):
            client.api("POST", "runs/update", {"run_id": ml["run_id"], "status": "RUNNING"})
        else:
            client.terminate(ml["run_id"], STATUS.get(state, "FAILED"))
    except MlflowError as exc:
        failed(run_dir, "mlflow", str(exc))
        return False
    append_event(run_dir, "mlflow_status", state=state, status=STATUS.get(state, "RUNNING"))
    return True


def failed(run_dir: str, tracker: str, error: str) -> None:
    """A tracker's failure, where `treb status` and a person reading events.jsonl see it."""
    with contextlib.suppress(OSError):
        append_event(run_dir, "tracking_failed", tracker=tracker, error=error)
