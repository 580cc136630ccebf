"""A run's experiment trackers as the processes that run it see them (docs/tracking.md).

Submission writes `tracking.json` (ids and URIs, never a credential); from it the ranks get
the MLFLOW_* / WANDB_* variables, so a script's own `mlflow.start_run()` or `wandb.init()`
continues the same run on every attempt and requeue. A tracker that does not answer costs a
bounded wait and an event: what did not get through waits in `tracking-pending.json` for
the next `treb` that sees the run (trebuchet/tracking.py `flush`), the status first.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Iterator

from ..rundir.records import append_event, read_json, write_json
from .mlflow_rest import STATUS, Mlflow, MlflowError, now_ms

FILE = "tracking.json"
PENDING = "tracking-pending.json"  # what did not reach the tracker yet, retried later
LOCK = ".tracking-pending.lock"  # held only while the pending file is read and rewritten
END_TIMEOUT_S = 3.0  # all of a run's end requests together (Slurm's KillWait is 30 s)
# The order a pending run's items are sent in: the status first.
ORDER = ("status", "tags", "params", "artifacts", "metrics", "diagnosis", "sweep")


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
    """`state` on the run's MLflow run within `timeout`; False (an event, the status kept
    pending for the next `treb`) when the server did not take it."""
    info = load(run_dir)
    ml = (info or {}).get("mlflow")
    if not ml:
        return True
    item = status_item(state, reason)
    try:
        send_status(Mlflow(ml["uri"], timeout=timeout), ml["run_id"], item)
    except MlflowError as exc:
        failed(run_dir, "mlflow", str(exc))
        with contextlib.suppress(OSError):
            defer(run_dir, {"status": item}, str(exc))
        return False
    with contextlib.suppress(OSError):
        settle(run_dir, "status", item)
    sent(run_dir, item)
    return True


def sent(run_dir: str, item: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        append_event(run_dir, "mlflow_status", state=item["state"],
                     status=STATUS.get(item["state"], "RUNNING"))  # fmt: skip


def status_item(state: str, reason: str = "", at: float | None = None) -> dict[str, Any]:
    """`at`: when it was decided (a later status replaces an earlier one not sent)."""
    return {"state": state, "reason": reason, "end_ms": now_ms(), "at": at or time.time()}


def send_status(client: Mlflow, run_id: str, item: dict[str, Any]) -> None:
    state, reason = item["state"], item.get("reason") or ""
    if state in ("RUNNING", "RETRYING"):
        client.api("POST", "runs/update", {"run_id": run_id, "status": "RUNNING"})
    else:
        client.terminate(run_id, STATUS.get(state, "FAILED"), item.get("end_ms"))
    tags = [("treb.state", state)] + ([("treb.reason", reason)] if reason else [])
    client.log_batch(run_id, tags=tags)


@contextlib.contextmanager
def _locked(run_dir: str) -> Iterator[None]:
    """Held for a read-modify-write of the pending file, never across a request."""
    import fcntl

    fd = os.open(os.path.join(run_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def pending(run_dir: str) -> dict[str, Any]:
    got = read_json(os.path.join(run_dir, PENDING))
    return got if isinstance(got, dict) else {}


def update(run_dir: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    path = os.path.join(run_dir, PENDING)
    with _locked(run_dir):
        items = pending(run_dir)
        change(items)
        if any(k in items for k in ORDER):
            write_json(path, items)
        else:
            items = {}
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return items


def defer(run_dir: str, items: dict[str, Any], error: str = "") -> dict[str, Any]:
    """Keep `items` for a later try: a status replaces an older one; tags, params and
    artifacts add to those kept; the others replace theirs."""

    def merge(kept: dict[str, Any]) -> None:
        for key, value in items.items():
            old = kept.get(key)
            if key == "status" and old and float(old.get("at") or 0) > float(value["at"]):
                continue  # a later status is already kept
            if key in ("tags", "params", "artifacts") and old:
                value = old + [v for v in value if v not in old]
            kept[key] = value
        if error:
            kept["error"] = error

    return update(run_dir, merge)


def settle(run_dir: str, key: str, done: Any = None) -> dict[str, Any]:
    """`key` got through: drop it (a status only when none newer was kept meanwhile)."""
    if not os.path.exists(os.path.join(run_dir, PENDING)):
        return {}

    def drop(kept: dict[str, Any]) -> None:
        old = kept.get(key)
        if old is None:
            return
        if key == "status" and done and float(old.get("at") or 0) > float(done.get("at") or 0):
            return
        if key in ("tags", "params", "artifacts") and isinstance(done, list):
            left = [v for v in old if v not in done]
            if left:
                kept[key] = left
                return
        del kept[key]

    return update(run_dir, drop)


def failed(run_dir: str, tracker: str, error: str) -> None:
    with contextlib.suppress(OSError):
        append_event(run_dir, "tracking_failed", tracker=tracker, error=error)
