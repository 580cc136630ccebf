"""Experiment trackers on the submitting side (docs/tracking.md): the MLflow run (a parent
per sweep) is created at submission, so that every rank of every attempt gets its id; the
end of the run (status, metrics, diagnosis) is logged by whichever process sees it.

Who logs what:
- submission (`open_run`, `open_sweep`): experiment, run, params, tags, spec.yaml;
  `tracking.json` in the run directory (W&B's ids too).
- the local supervisor at the end of a run, or `treb` when it follows or refreshes a run
  that ended elsewhere (`close`): metrics from the store, the diagnosis of a run that did
  not succeed, the final status; the sweep's parent once all its points ended.
- the Slurm job controller (runtime/tracking.py `mark`): the final status as soon as the
  job ends, also when nobody follows it, and RUNNING again after a requeue.

Nothing here fails or holds up a run: every request has a short timeout, a tracker that
fails is a warning and a `tracking_failed` event, and a server that did not answer is not
asked again by this process. It imports neither mlflow nor wandb, nor pydantic.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.errors import UserError
from trebuchet.runtime import tracking as rt
from trebuchet.runtime.mlflow_rest import Mlflow, MlflowError, metric, usable_uri
from trebuchet.store.files import append_event, write_json
from trebuchet.store.states import CANCELLED, SUCCEEDED, TERMINAL

if TYPE_CHECKING:
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store

Warn = Callable[[str], None]
CLOSED = "tracking-closed"  # claimed by the one process that logs a run's end
MAX_METRIC_POINTS = 1_000_000  # per run, sent to MLflow at its end
_down: dict[str, str] = {}  # tracking URI -> why it failed in this process: not asked again


def mlflow_target(loaded: LoadedSpec, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(tracking URI, experiment name) when the run is tracked in MLflow: the spec's
    `tracking.mlflow`, or MLFLOW_TRACKING_URI in the submitting environment."""
    spec = loaded.spec
    block = spec.tracking.mlflow if spec.tracking else None
    if block is not None and not block.enabled:
        return None
    uri = (block.uri if block else None) or environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        if block is not None:
            raise UserError(
                f"{loaded.where('tracking', 'mlflow')}: tracking.mlflow: no uri, and "
                "MLFLOW_TRACKING_URI is not set in this shell"
            )
        return None
    if not usable_uri(uri):
        if block is not None:  # the spec's uri is validated; this one came from the shell
            raise UserError(
                f"{loaded.where('tracking', 'mlflow')}: tracking.mlflow: MLFLOW_TRACKING_URI "
                f"{uri!r} is not a tracking server (http:// or https://)"
            )
        return None  # a file store of the user's own scripts: theirs, not trebuchet's
    if "@" in uri.split("://", 1)[-1].split("/", 1)[0]:  # user:password@host
        raise UserError(
            f"{loaded.where('tracking', 'mlflow')}: the MLflow tracking URI carries credentials "
            "(user:password@host), which would be written into the run directory: give them "
            "as secrets MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (docs/tracking.md)"
        )
    experiment = (
        (block.experiment if block else None) or environ.get("MLFLOW_EXPERIMENT_NAME") or spec.name
    )
    return uri, experiment


def _client(uri: str, run_dir: Path | None) -> Mlflow | None:
    """A client, or None (and the reason in the run's events) when the server failed
    earlier in this process: a 100-point sweep does not wait 100 timeouts."""
    if uri in _down:
        if run_dir is not None:
            rt.failed(str(run_dir), "mlflow", _down[uri])
        return None
    return Mlflow(uri)


def _fail(uri: str, exc: MlflowError, run_dir: Path, warn: Warn | None) -> None:
    if uri not in _down and warn:
        warn(f"warning: mlflow: {exc}; the run goes on without MLflow tracking")
    _down[uri] = str(exc)
    rt.failed(str(run_dir), "mlflow", str(exc))


def open_sweep(sweep_id: str, loaded: LoadedSpec, points: int, warn: Warn | None) -> dict | None:
    """The sweep's parent MLflow run (its children are the points); None when untracked."""
    target = mlflow_target(loaded, os.environ)
    if target is None:
        return None
    uri, experiment = target
    from trebuchet.store.paths import sweep_file

    where = sweep_file(sweep_id).parent
    client = _client(uri, None)
    if client is None:
        return None
    try:
        exp = client.experiment_id(experiment)
        tags = [("treb.sweep_id", sweep_id), ("treb.points", str(points)),
                *_common_tags(loaded)]  # fmt: skip
        info = client.create_run(exp, f"{loaded.spec.name}-{sweep_id}", tags)
    except MlflowError as exc:
        if uri not in _down and warn:
            warn(f"warning: mlflow: {exc}; the sweep goes on without MLflow tracking")
        _down[uri] = str(exc)
        return None
    parent = {"uri": uri, "experiment_id": exp, "run_id": info["run_id"]}
    write_json(where / f"{sweep_id}.tracking.json", parent)
    return parent


def open_run(
    sub: Submission, warn: Warn | None = None, *, params: dict[str, str] | None = None,
    sweep_id: str | None = None, parent: dict | None = None,
) -> None:  # fmt: skip
    """The run's trackers, before it is submitted: `tracking.json` for its ranks."""
    loaded, rec = sub.loaded, sub.record
    info: dict[str, Any] = {}
    spec = loaded.spec
    wandb = spec.tracking.wandb if spec.tracking else None
    if wandb is not None:
        info["wandb"] = {"run_id": f"treb-{rec.id}", "name": spec.name, "project": wandb.project,
                         "entity": wandb.entity, "group": sweep_id}  # fmt: skip
    target = mlflow_target(loaded, os.environ)
    if target is not None:
        ml = _open_mlflow(sub, target, params or {}, sweep_id, parent, warn)
        if ml:
            info["mlflow"] = ml
    if info:
        write_json(sub.run_dir / rt.FILE, info)


def _open_mlflow(
    sub: Submission, target: tuple[str, str], params: dict[str, str], sweep_id: str | None,
    parent: dict | None, warn: Warn | None,
) -> dict | None:  # fmt: skip
    uri, experiment = target
    client = _client(uri, sub.run_dir)
    if client is None:
        return None
    rec, spec = sub.record, sub.loaded.spec
    tags = [("treb.run_id", rec.id), ("treb.run_dir", str(sub.run_dir)),
            *_common_tags(sub.loaded), ("treb.backend", rec.backend),
            ("treb.shape", f"{rec.nodes}x{rec.procs_per_node}")]  # fmt: skip
    if rec.git_commit:
        tags += [("mlflow.source.git.commit", rec.git_commit),
                 ("treb.git_dirty", str(bool(rec.git_dirty)).lower())]  # fmt: skip
    if sweep_id:
        tags.append(("treb.sweep_id", sweep_id))
    if parent:
        tags.append(("mlflow.parentRunId", parent["run_id"]))
    run_params = [("treb.backend", rec.backend), ("treb.launcher", rec.launcher),
                  ("treb.nodes", str(rec.nodes)), ("treb.procs_per_node", str(rec.procs_per_node)),
                  ("treb.world_size", str(rec.nodes * rec.procs_per_node)),
                  ("treb.gpus_per_node", str(spec.gpus_per_node)),
                  ("treb.retries", str(spec.retries)),
                  ("treb.commit", rec.git_commit or "")]  # fmt: skip
    run_params += sorted(params.items())  # a sweep point's own values: the user's names
    info = None
    try:
        exp = parent["experiment_id"] if parent else client.experiment_id(experiment)
        info = client.create_run(exp, spec.name, tags)
        client.log_batch(info["run_id"], params=run_params)
        spec_text = (sub.run_dir / "spec.yaml").read_bytes()
        client.upload(info["artifact_uri"], "spec.yaml", spec_text)
    except (MlflowError, OSError) as exc:
        err = exc if isinstance(exc, MlflowError) else MlflowError(str(exc))
        _fail(uri, err, sub.run_dir, warn)
        if info is None:
            return None  # else the run exists: the ranks still log into it
    append_event(sub.run_dir, "mlflow_run", run_id=info["run_id"], experiment_id=exp, uri=uri)
    return {"uri": uri, "experiment_id": exp, "run_id": info["run_id"],
            "artifact_uri": info.get("artifact_uri", ""),
            "parent_run_id": parent["run_id"] if parent else None}  # fmt: skip


def _common_tags(loaded: LoadedSpec) -> list[tuple[str, str]]:
    spec = loaded.spec
    tags = [("mlflow.source.type", "JOB"), ("treb.name", spec.name),
            ("treb.launcher", spec.launcher)]  # fmt: skip
    if loaded.path:
        tags.append(("mlflow.source.name", str(loaded.path)))
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    if user:
        tags.append(("mlflow.user", user))
    return tags


# -- the end of a run -------------------------------------------------------------------------
def claim(path: Path) -> bool:
    """True for the one process that creates `path` (O_EXCL): it logs the end, once."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return False
    return True


def close(store: Store, run_id: str) -> None:
    """Log the end of a run that has ended: metrics, diagnosis, final status; then the
    sweep's parent when this was its last point. Once per run (the `tracking-closed`
    claim); never raises."""
    rec = store.get(run_id)
    if rec is None or rec.state not in TERMINAL:
        return
    run_dir = Path(rec.run_dir)
    info = rt.load(str(run_dir))
    ml = (info or {}).get("mlflow")
    if not ml or not claim(run_dir / CLOSED):
        return
    client = Mlflow(ml["uri"], timeout=rt.END_TIMEOUT_S)
    try:
        points, note = _metrics(store, rec)
        if note:
            append_event(run_dir, "mlflow_metrics", note=note)
        tags = [("treb.attempts", str(rec.attempt + 1))]
        if rec.exit_code is not None:
            tags.append(("treb.exit_code", str(rec.exit_code)))
        if rec.state != SUCCEEDED:
            tags += _diagnosis(store, rec, client, ml["artifact_uri"])
        client.log_batch(ml["run_id"], tags=tags, metrics=points)
    except MlflowError as exc:
        rt.failed(str(run_dir), "mlflow", str(exc))
        if exc.unreachable:  # one timeout is enough
            return
    except Exception as exc:  # noqa: BLE001 - a tracker never breaks the caller
        rt.failed(str(run_dir), "mlflow", f"{type(exc).__name__}: {exc}")
    if not rt.mark(str(run_dir), rec.state, _reason(store, rec)):
        return
    if rec.sweep_id and ml.get("parent_run_id"):
        _close_sweep(store, rec.sweep_id)


def close_ended(store: Store, runs: list[RunRecord]) -> None:
    """After a refresh: the tracked runs among `runs` (active before it) that have ended."""
    for rec in runs:
        run_dir = Path(rec.run_dir)
        if (run_dir / rt.FILE).exists() and not (run_dir / CLOSED).exists():
            close(store, rec.id)


def _reason(store: Store, rec: RunRecord) -> str:
    attempts = {a["attempt"]: a for a in store.attempts(rec.id)}
    return (attempts.get(rec.attempt) or {}).get("reason") or ""


def _metrics(store: Store, rec: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """The run's metrics (store/metrics.py: read from the rank logs by the agents, ingested
    here first so that the last points count) as MLflow metrics, each series of the
    lowest rank that has it; a note when none can be sent."""
    fetch = getattr(store, "metrics", None)
    if fetch is None:
        return [], "this trebuchet has no metrics store: only the program's own logging"
    try:
        from trebuchet.store.metrics import ingest
    except ImportError:  # pragma: no cover - a store without the ingest step
        pass
    else:
        ingest(store, rec)
    out: list[dict[str, Any]] = []
    for name, points in sorted(fetch(rec.id).items()):
        for step, value, at in points:
            if value is None:
                continue
            ms = int(float(at or rec.ended_at or time.time()) * 1000)
            out.append(metric(str(name), float(value), int(step or 0), ms))
            if len(out) >= MAX_METRIC_POINTS:
                return out, f"only the first {MAX_METRIC_POINTS} points were sent"
    return out, ""


def _diagnosis(store: Store, rec: RunRecord, client: Mlflow, artifact_uri: str) -> list:
    """diagnosis.txt and .json as artifacts; the cause as a tag."""
    from trebuchet.diagnose import report

    d = report.diagnose_record(store, rec)
    client.upload(artifact_uri, "diagnosis.txt", report.text(d).encode())
    client.upload(artifact_uri, "diagnosis.json",
                  json.dumps(d.to_json(), indent=2, default=str).encode())  # fmt: skip
    return [("treb.cause", report.cause_line(d))] if d.category else []


def _close_sweep(store: Store, sweep_id: str) -> None:
    from trebuchet.store.paths import sweep_file

    runs = store.sweep_runs(sweep_id)
    if not runs or any(r.state not in TERMINAL for r in runs):
        return
    folder = sweep_file(sweep_id).parent
    parent = json.loads((folder / f"{sweep_id}.tracking.json").read_text())
    if not claim(folder / f"{sweep_id}.{CLOSED}"):
        return
    states = [r.state for r in runs]
    status = ("FINISHED" if all(s == SUCCEEDED for s in states)
              else "KILLED" if CANCELLED in states else "FAILED")  # fmt: skip
    client = Mlflow(parent["uri"], timeout=rt.END_TIMEOUT_S)
    failed = sum(s != SUCCEEDED for s in states)
    try:
        client.log_batch(parent["run_id"], tags=[("treb.failed_points", str(failed))])
        client.terminate(parent["run_id"], status)
    except MlflowError:
        pass  # each point's events.jsonl already says when the server is down
