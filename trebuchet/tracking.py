"""Experiment trackers on the submitting side (docs/tracking.md): the MLflow run (a parent
per sweep) is created at submission so that every rank of every attempt gets its id; the
run's end (status, metrics, diagnosis) is logged by whichever process sees it: the local
supervisor, a `treb` that follows or refreshes the run, or the Slurm job controller
(runtime/publish/trackers.py).

Nothing here fails or holds up a run: requests share a deadline (5 s at submission, 3 s at
the end), a failing tracker is a warning and a `tracking_failed` event, a server that did
not answer is not asked again by this process, and what did not get through is kept in
`tracking-pending.json` for the next `treb` (`retry_pending`). No mlflow, wandb or pydantic.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.errors import UserError
from trebuchet.runtime.publish import trackers as rt
from trebuchet.runtime.publish.mlflow_rest import Mlflow, MlflowError, metric, usable_uri
from trebuchet.runtime.rundir.records import read_json
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.store.files import append_event, write_json
from trebuchet.store.states import CANCELLED, SUCCEEDED, TERMINAL

if TYPE_CHECKING:
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store

Warn = Callable[[str], None]
CLOSED = "tracking-closed"  # claimed by the one process that logs a run's end
MAX_METRIC_POINTS = 1_000_000  # per run, sent to MLflow at its end
RETRY_BUDGET_S = 3.0  # one command's ends and retries, all runs together
PENDING_DIR = "tracking-pending"  # TREB_HOME/tracking-pending/<run id>: runs with items left
_down: dict[str, str] = {}  # tracking URI -> why it failed in this process: not asked again


def mlflow_target(loaded: LoadedSpec, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(tracking URI, experiment) from the spec's `tracking.mlflow` or the shell's
    MLFLOW_TRACKING_URI; None when the run is not tracked in MLflow."""
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


def _fail(
    uri: str, exc: MlflowError, run_dir: Path | None, warn: Warn | None, what: str = "run"
) -> None:
    if uri not in _down and warn:
        warn(f"warning: mlflow: {exc}; the {what} goes on without MLflow tracking")
    _down[uri] = str(exc)
    if run_dir is not None:
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
        hide = hider(loaded.spec.secrets)
        tags = [(k, hide(v)) for k, v in [("treb.sweep_id", sweep_id),
                ("treb.points", str(points)), *_common_tags(loaded)]]  # fmt: skip
        info = client.create_run(exp, f"{loaded.spec.name}-{sweep_id}", tags)
    except MlflowError as exc:
        _fail(uri, exc, None, warn, "sweep")
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
        try:
            ml = _open_mlflow(sub, target, params or {}, sweep_id, parent, warn)
        except KeyboardInterrupt:  # Ctrl+C while the server is asked: the run never starts
            from trebuchet.store import lifecycle

            with contextlib.suppress(Exception):
                lifecycle.ended(sub.store, rec.id, CANCELLED, "interrupted (Ctrl+C) before it "
                                "started, while its MLflow run was being created")  # fmt: skip
            raise
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
    hide = hider(spec.secrets)  # a secret's value in any of them is sent as its name
    tags = [(k, hide(v)) for k, v in tags]
    run_params = [(k, hide(v)) for k, v in run_params]
    try:
        exp = parent["experiment_id"] if parent else client.experiment_id(experiment)
        info = client.create_run(exp, spec.name, tags)
    except MlflowError as exc:
        _fail(uri, exc, sub.run_dir, warn)
        return None
    # The run exists: the ranks log into it whatever happens next. What does not get
    # through within the budget is kept for the next `treb` (retry_pending).
    rest: dict[str, Any] = {"params": [list(p) for p in run_params], "artifacts": ["spec.yaml"]}
    try:
        client.log_batch(info["run_id"], params=run_params)
        del rest["params"]
        spec_text = hide(read_text(sub.run_dir / "spec.yaml")).encode()  # a regular file only
        client.upload(info["artifact_uri"], "spec.yaml", spec_text)
        del rest["artifacts"]
    except (MlflowError, OSError) as exc:
        err = exc if isinstance(exc, MlflowError) else MlflowError(str(exc))
        _fail(uri, err, sub.run_dir, warn)
        with contextlib.suppress(OSError):
            rt.defer(str(sub.run_dir), rest, str(err))
            _remember(rec.id)
    append_event(sub.run_dir, "mlflow_run", run_id=info["run_id"], experiment_id=exp, uri=uri)
    return {"uri": uri, "experiment_id": exp, "run_id": info["run_id"],
            "artifact_uri": info.get("artifact_uri", ""),
            "parent_run_id": parent["run_id"] if parent else None}  # fmt: skip


# Credentials trebuchet knows by name (spec/model.py TRACKER_SECRETS; not imported: pydantic).
CREDENTIALS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD", "WANDB_API_KEY")


def hider(secrets: Any, environ: Mapping[str, str] = os.environ) -> Callable[[str], str]:
    """text -> text with each secret's value (the spec's `secrets` and the tracker
    credentials, 4 characters or more) as `${NAME}`: what a tracker is sent never carries
    one, whatever the program printed."""
    names = {*CREDENTIALS, *(str(n) for n in secrets or ())}
    found = [(environ[n], n) for n in names if len(environ.get(n) or "") >= 4]
    found += [(json.dumps(v)[1:-1], n) for v, n in found]  # as a JSON string holds it
    values = sorted(set(found), key=lambda pair: -len(pair[0]))

    def hide(text: str) -> str:
        text = str(text)
        for value, name in values:
            text = text.replace(value, "${" + name + "}")
        return text

    return hide


def _run_hider(run_dir: Path) -> Callable[[str], str]:
    """hider() of a run: its secrets' names from its spec.json."""
    spec = read_json(str(run_dir / "spec.json"))  # a rank's FIFO never blocks
    return hider(spec.get("secrets") if isinstance(spec, dict) else None)


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
def claim(path: Path, owner: str = "") -> bool:
    """True for the one process that creates `path` (O_EXCL): it logs the end, once. With
    `owner`, the file says who claimed it, and that owner's later tries claim it again."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        try:
            return bool(owner) and path.read_text() == owner
        except OSError:
            return False
    except OSError:
        return False
    try:
        if owner:
            os.write(fd, owner.encode())
    finally:
        os.close(fd)
    return True


def close(store: Store, run_id: str, budget: float = rt.END_TIMEOUT_S) -> None:
    """Log an ended run's end (status first) once per run (the `tracking-closed` claim),
    within `budget`; what does not get through is left for `retry_pending`. Never raises."""
    rec = store.get(run_id)
    if rec is None or rec.state not in TERMINAL:
        return
    run_dir = Path(rec.run_dir)
    info = rt.load(str(run_dir))
    ml = (info or {}).get("mlflow")
    if not ml or not claim(run_dir / CLOSED):
        return
    status = rt.status_item(rec.state, _reason(store, rec))
    if rec.ended_at:
        status["end_ms"] = int(rec.ended_at * 1000)
    tags = [["treb.attempts", str(rec.attempt + 1)]]
    if rec.exit_code is not None:
        tags.append(["treb.exit_code", str(rec.exit_code)])
    items: dict[str, Any] = {"status": status, "tags": tags, "metrics": {"sent": 0}}
    if rec.state != SUCCEEDED:
        items["diagnosis"] = True
    if rec.sweep_id and ml.get("parent_run_id"):
        items["sweep"] = rec.sweep_id
    try:  # kept first: a process killed while it sends leaves them for the next `treb`
        rt.defer(str(run_dir), items)
    except OSError as exc:
        rt.failed(str(run_dir), "mlflow", f"pending file: {exc}")
        return
    if budget <= 0 or ml["uri"] in _down:
        _remember(rec.id)
        return
    _flush_within(store, rec, ml["uri"], budget)


def close_ended(store: Store, runs: list[RunRecord]) -> None:
    """After a refresh: close the tracked `runs` that ended, then `retry_pending`, all within
    RETRY_BUDGET_S: `treb ps` over many ended runs does not wait for each."""
    deadline = time.monotonic() + RETRY_BUDGET_S
    for rec in runs:
        run_dir = Path(rec.run_dir)
        if (run_dir / rt.FILE).exists() and not (run_dir / CLOSED).exists():
            close(store, rec.id, deadline - time.monotonic())
    retry_pending(store, deadline - time.monotonic())


# -- what did not get through: sent again by the next `treb` ------------------------------------


def _marker(run_id: str) -> Path:
    from trebuchet.store.paths import home_path

    return home_path() / PENDING_DIR / run_id


def _remember(run_id: str) -> None:
    path = _marker(run_id)
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        path.touch(mode=0o600)


def _forget(run_id: str) -> None:
    path = _marker(run_id)
    with contextlib.suppress(OSError):
        path.unlink()
        path.parent.rmdir()  # the last one: `treb ps` then finds no folder to look into


def _retry_later(run_dir: Path, error: str) -> None:
    """A try failed: the next one not before a delay that doubles (at most a minute)."""

    def note(kept: dict[str, Any]) -> None:
        tries = int(kept.get("tries") or 0) + 1
        kept.update(tries=tries, error=error, next_try=time.time() + min(60, 2 ** (tries - 1)))

    with contextlib.suppress(OSError):
        rt.update(str(run_dir), note)


def retry_pending(store: Store, budget: float = RETRY_BUDGET_S) -> None:
    """Send what earlier tries left, run by run, within `budget` seconds for them all; a
    server that fails is not asked again by this process. Never raises."""
    from trebuchet.store.paths import RUN_ID_RE, home_path

    folder = home_path() / PENDING_DIR
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    deadline = time.monotonic() + budget
    for run_id in names:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            rec = store.get(run_id) if RUN_ID_RE.match(run_id) else None
        except Exception:  # noqa: BLE001 - a tracker never breaks the caller
            return
        run_dir = Path(rec.run_dir) if rec else None
        items = rt.pending(str(run_dir)) if run_dir else {}
        ml = ((rt.load(str(run_dir)) or {}).get("mlflow") if run_dir else None) or {}
        if rec is None or not items or not ml:
            _forget(run_id)
            continue
        if float(items.get("next_try") or 0) > time.time() or ml["uri"] in _down:
            continue
        _flush_within(store, rec, ml["uri"], left)


def _flush_within(store: Store, rec: RunRecord, uri: str, budget: float) -> None:
    """flush() within `budget`; a server that did not take it all is not asked again."""
    if not flush(store, rec, Mlflow(uri, timeout=min(budget, rt.END_TIMEOUT_S))):
        _down[uri] = str(rt.pending(str(rec.run_dir)).get("error") or "did not answer")


def flush(store: Store, rec: RunRecord, client: Mlflow) -> bool:
    """Send the run's pending items in order, each dropped once the server took it; False
    when the server must be asked again later. Never raises."""
    run_dir = Path(rec.run_dir)
    ml = ((rt.load(str(run_dir)) or {}).get("mlflow")) or {}
    items = rt.pending(str(run_dir))
    for key in rt.ORDER:
        if key not in items or not ml:
            continue
        value = items[key]
        try:
            _send(store, rec, client, ml, key, value)
        except MlflowError as exc:
            rt.failed(str(run_dir), "mlflow", str(exc))
            if not exc.lasting:  # not answered, or not now: again later
                _retry_later(run_dir, str(exc))
                _remember(rec.id)
                return False
        except Exception as exc:  # noqa: BLE001 - a file gone, a bug: an event, not a retry loop
            rt.failed(str(run_dir), "mlflow", f"{key}: {type(exc).__name__}: {exc}")
        with contextlib.suppress(OSError):
            rt.settle(str(run_dir), key, value)
        if key == "status":
            rt.sent(str(run_dir), value)
    if rt.pending(str(run_dir)):  # kept meanwhile by another process (a Slurm controller)
        _remember(rec.id)
        return True
    _forget(rec.id)
    return True


def _send(store: Store, rec: RunRecord, client: Mlflow, ml: dict, key: str, value: Any) -> None:
    run_id = ml["run_id"]
    run_dir = Path(rec.run_dir)
    hide = _run_hider(run_dir)
    if key == "status":
        rt.send_status(client, run_id, {**value, "reason": hide(value.get("reason") or "")})
    elif key == "tags":
        client.log_batch(run_id, tags=[(k, hide(v)) for k, v in value])
    elif key == "params":
        client.log_batch(run_id, params=[(k, hide(v)) for k, v in value])
    elif key == "artifacts":
        for name in value:
            text = hide(read_text(run_dir / name))  # a regular file only: a rank can reach it
            client.upload(ml["artifact_uri"], name, text.encode())
    elif key == "metrics":
        _send_metrics(store, rec, client, run_id, int(value.get("sent") or 0))
    elif key == "diagnosis":
        if not isinstance(value, dict):  # computed once, by the first try: then kept as sent
            value = _diagnosis(store, rec, hide)
            with contextlib.suppress(OSError):
                rt.update(str(run_dir), lambda kept: kept.update(diagnosis=value)
                          if "diagnosis" in kept else None)  # fmt: skip
        client.upload(ml["artifact_uri"], "diagnosis.txt", value["txt"].encode())
        client.upload(ml["artifact_uri"], "diagnosis.json", value["json"].encode())
        if value.get("cause"):
            client.log_batch(run_id, tags=[("treb.cause", value["cause"])])
    elif key == "sweep":
        _close_sweep(store, str(value), rec.id, client)


def _send_metrics(store: Store, rec: RunRecord, client: Mlflow, run_id: str, done: int) -> None:
    """The metrics from point `done` on; the pending file follows each log-batch call."""
    points, note = _metrics(store, rec)
    run_dir = str(rec.run_dir)
    if note and not done:
        append_event(Path(run_dir), "mlflow_metrics", note=note)
    count = [done]

    def advance(n: int) -> None:
        count[0] += n

        def note_sent(kept: dict[str, Any]) -> None:
            if "metrics" in kept:
                kept["metrics"] = {"sent": max(count[0], int(kept["metrics"].get("sent") or 0))}

        rt.update(run_dir, note_sent)

    client.log_batch(run_id, metrics=points[done:], sent=advance)


def _reason(store: Store, rec: RunRecord) -> str:
    attempts = {a["attempt"]: a for a in store.attempts(rec.id)}
    return (attempts.get(rec.attempt) or {}).get("reason") or ""


def _metrics(store: Store, rec: RunRecord) -> tuple[list[dict[str, Any]], str]:
    """The run's metrics (ingested first: the last points count) as MLflow metrics, each
    series of the lowest rank that has it, and a note when some are not sent. The same
    list on every try (a point without a time gets the run's end): a retry resumes where
    the last one stopped."""
    from trebuchet.store.metrics import ingest

    ingest(store, rec)
    out: list[dict[str, Any]] = []
    fallback = rec.ended_at or rec.created_at
    for name, points in sorted(store.metrics(rec.id).items()):
        for step, value, at in points:
            if value is None:
                continue
            value = float(value)
            if not math.isfinite(value):
                continue  # JSON has no NaN or infinity; MLflow's REST API refuses them
            ms = int(float(at or fallback) * 1000)
            out.append(metric(str(name), value, int(step or 0), ms))
            if len(out) >= MAX_METRIC_POINTS:
                return out, f"only the first {MAX_METRIC_POINTS} points were sent"
    return out, ""


def _diagnosis(store: Store, rec: RunRecord, hide: Callable[[str], str]) -> dict[str, str]:
    """diagnosis.txt and .json (artifacts) and the cause (a tag), secrets' values hidden:
    they quote the ranks' logs."""
    from trebuchet.diagnose import report

    d = report.diagnose_record(store, rec)
    return {"txt": hide(report.text(d)),
            "json": hide(json.dumps(d.to_json(), indent=2, default=str)),
            "cause": hide(report.cause_line(d)) if d.category else ""}  # fmt: skip


def _close_sweep(store: Store, sweep_id: str, point: str, client: Mlflow) -> None:
    """End the sweep's parent once all its points ended, by the point that claims it (again
    on its retries); MlflowError when the server did not take it."""
    from trebuchet.store.paths import sweep_file

    runs = store.sweep_runs(sweep_id)
    if not runs or any(r.state not in TERMINAL for r in runs):
        return  # the last point to end does it
    folder = sweep_file(sweep_id).parent
    try:
        parent = json.loads((folder / f"{sweep_id}.tracking.json").read_text())
    except (OSError, ValueError):
        return
    if not claim(folder / f"{sweep_id}.{CLOSED}", owner=point):
        return
    states = [r.state for r in runs]
    status = ("FINISHED" if all(s == SUCCEEDED for s in states)
              else "KILLED" if CANCELLED in states else "FAILED")  # fmt: skip
    failed = sum(s != SUCCEEDED for s in states)
    client.terminate(parent["run_id"], status)
    client.log_batch(parent["run_id"], tags=[("treb.failed_points", str(failed))])
