"""A sweep on Slurm: one job array whose task i runs point i's own sbatch script.

Why one array and not N sbatch calls: one submission (one slurmctld RPC), Slurm's own
`%` limit for sweep_parallel, one job id to find and cancel. Each point stays a recorded run
with its own run dir and its own rendered script (submit.sbatch, as for a single run); the
array script holds the shared #SBATCH header (an array has one shape, so every point must
ask Slurm for the same resources) and dispatches on $SLURM_ARRAY_TASK_ID: it sends its
output to the point's batch.log and execs the point's script (same pid: Slurm's signals
reach its traps). Each run's backend_id is `<array job id>_<task>`, as squeue -r prints it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.slurm.avoid import exclude
from trebuchet.backends.slurm.script import _directive, q, sbatch_lines, write_job
from trebuchet.errors import TrebError, UserError
from trebuchet.runtime.process.procs import hostname
from trebuchet.spec.sweep import point_text
from trebuchet.store import lifecycle
from trebuchet.store.files import append_event, write_atomic
from trebuchet.store.states import CANCELLED, FAILED, SUCCEEDED, TERMINAL

if TYPE_CHECKING:
    from trebuchet.backends.base import SubmissionPoint, SweepSubmitted
    from trebuchet.backends.slurm.engine import SlurmBackend
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec

# Header lines every point has of its own; the rest must be the same for all points.
OWN = ("--job-name", "--output", "--open-mode")
# The spec field behind each #SBATCH flag, to name in the error.
FIELDS = {
    "--nodes": "nodes", "--ntasks-per-node": "procs_per_node / launcher",
    "--cpus-per-task": "slurm.cpus_per_task", "--gpus-per-node": "gpus_per_node",
    "--mem": "slurm.mem", "--account": "slurm.account", "--partition": "slurm.partition",
    "--qos": "slurm.qos", "--constraint": "slurm.constraint", "--exclusive": "slurm.exclusive",
    "--time": "slurm.time / timeout", "--signal": "timeout_warning / checkpoint_signal",
    "--requeue": "retries", "--no-requeue": "retries",
}  # fmt: skip


def _flag(line: str) -> str:
    return line.removeprefix("#SBATCH ").split("=", 1)[0]


def shared_lines(spec: Any, run_dir: Path) -> list[str]:
    return [line for line in sbatch_lines(spec, run_dir) if _flag(line) not in OWN]


def check_shape(points: list[tuple[dict[str, str], LoadedSpec]]) -> None:
    """Refuse (exit 2) a sweep whose points ask Slurm for different resources."""
    placeholder = Path("/RUN_DIR")
    first_point, first = points[0]
    want = shared_lines(first.spec, placeholder)
    for point, loaded in points[1:]:
        got = shared_lines(loaded.spec, placeholder)
        if got == want:
            continue
        a = {_flag(x): x for x in want}
        b = {_flag(x): x for x in got}
        flag = next((f for f in [*a, *b] if a.get(f) != b.get(f)), _flag(got[0]))
        field = FIELDS.get(flag, "slurm.sbatch_args")
        raise UserError(
            f"sweep on slurm: {field} differs between points ({_show(flag, first_point, a)} "
            f"vs {_show(flag, point, b)}): a sweep is one job array, and every point must ask "
            "Slurm for the same resources; sweep that field in separate `treb run`s"
        )


def _show(flag: str, point: dict[str, str], lines: dict[str, str]) -> str:
    params = point_text(point)
    line = lines[flag].removeprefix("#SBATCH ") if flag in lines else f"no {flag}"
    return f"{line} at {params}"


def render_array(sweep_id: str, subs: list[Submission], parallel: int | None, log_dir: Path,
                 avoid: list[str] | None = None) -> str:  # fmt: skip
    """The array script: the shared header, --array, and the dispatch to each point;
    `avoid`: the --exclude line of the nodes with a bad history (avoid.py)."""
    first = subs[0].loaded.spec
    names = {s.loaded.spec.name for s in subs}
    name = first.name if len(names) == 1 else f"treb-sweep-{sweep_id}"
    out = str(log_dir / f"{sweep_id}-").replace("%", "%%") + "%a.log"
    limit = f"%{parallel}" if parallel else ""
    lines = [
        "#!/bin/bash",
        f"# trebuchet sweep {sweep_id}: {len(subs)} runs as one Slurm job array"
        f"{f', at most {parallel} at once' if parallel else ''}.",
        "# Array task i runs point i's own script, with its output in the point's batch.log.",
        _directive("--job-name", name),
        *shared_lines(first, Path("/RUN_DIR")),
        *(avoid or []),  # after the spec's own --exclude: sbatch takes the last
        _directive("--output", out),
        _directive("--open-mode", "append"),
        _directive("--array", f"0-{len(subs) - 1}{limit}"),
        "",
        "case ${SLURM_ARRAY_TASK_ID:-} in",
    ]
    for i, sub in enumerate(subs):
        lines.append(f"{i}) treb_dir={q(sub.run_dir)} ;;  # run {sub.record.id}")
    lines += [
        '*) echo "treb: sweep ' + sweep_id + ": no run for array task "
        '${SLURM_ARRAY_TASK_ID:-?}" >&2; exit 2 ;;',
        "esac",
        'exec >>"$treb_dir/batch.log" 2>&1',
        'exec bash "$treb_dir/submit.sbatch"',
    ]
    return "\n".join(lines) + "\n"


def submit(
    backend: Any, sweep_id: str, subs: list[Submission], parallel: int | None, log_dir: Path
) -> str:
    """Render every point's script and the array script, one sbatch; returns the job id."""
    avoid, hosts = avoided(subs)
    for sub in subs:  # as SlurmBackend.submit: an environment is built (or reused) first
        recipe = backend.recipe(sub.loaded)
        if recipe:
            try:
                backend.build_environment(sub, recipe)
            except TrebError as exc:  # no array without every point: none is submitted
                _fail([s for s in subs if s is not sub], f"not submitted: {exc}")
                raise
        write_job(sub.loaded.spec, sub.loaded.workdir, sub.record.id, sub.run_dir, recipe, avoid)
        if hosts:
            append_event(sub.run_dir, "nodes_avoided", hosts=hosts, how="sbatch --exclude")
    path = log_dir / f"{sweep_id}.sbatch"
    write_atomic(path, render_array(sweep_id, subs, parallel, log_dir, avoid))
    job_id = _sbatch(subs, path)
    host = hostname()
    for i, sub in enumerate(subs):
        task = f"{job_id}_{i}"
        sub.store.update_run(sub.record.id, backend_id=task, host=host)
        append_event(sub.run_dir, "sbatch", job_id=task, array=str(path), sweep_id=sweep_id,
                     backend_id=task)  # fmt: skip
    print(f"treb: Slurm job array {job_id} (tasks {job_id}_0..{job_id}_{len(subs) - 1}); "
          f"script {path}", file=sys.stderr)  # fmt: skip
    return job_id


def submit_sweep(
    backend: SlurmBackend, sweep_id: str, points: list[SubmissionPoint], attach: bool
) -> SweepSubmitted:
    """All points as one Slurm job array; attached: follow every point until it ends."""
    from trebuchet.backends.base import SweepSubmitted
    from trebuchet.store.files import write_json
    from trebuchet.store.paths import sweep_file

    subs = [sub for _, sub in points]
    parallel = subs[0].loaded.spec.sweep_parallel  # unset: as many at once as Slurm allows
    runs: list[dict[str, Any]] = [
        {"index": index, "id": sub.record.id, "run_dir": str(sub.run_dir), "params": point}
        for index, (point, sub) in enumerate(points)
    ]
    path = sweep_file(sweep_id)
    job_id = submit(backend, sweep_id, subs, parallel, path.parent)
    write_json(path, {"id": sweep_id, "backend": "slurm", "job_id": job_id,
                      "parallel": parallel, "runs": runs})  # fmt: skip
    at_once = f"at most {parallel} at once" if parallel else "as many at once as Slurm allows"
    print(f"treb: sweep {sweep_id}: {len(runs)} runs, {at_once}", file=sys.stderr)
    for run in runs:
        task = f"{job_id}_{run['index']}"
        print(f"treb:   {run['index']}  {run['id']}  {task}  {point_text(run['params'])}",
              file=sys.stderr)  # fmt: skip
    if not attach:
        return SweepSubmitted(sweep_id, len(runs))
    failed, sig = follow(backend, subs[0].store, job_id, runs)
    return SweepSubmitted(sweep_id, len(runs), failed, sig or None)


def avoided(subs: list[Submission]) -> tuple[list[str], list[str]]:
    """The array's --exclude line and hosts: the nodes with a bad history, as a single
    job's (avoid.py, docs/nodes.md), said once. One line for the whole array, so the
    points must agree on it (allow_nodes alike); a named refusal where they do not."""
    try:
        first = exclude(subs[0].loaded.spec, subs[0].store)
        for sub in subs[1:]:
            other = exclude(sub.loaded.spec, sub.store, say=False)
            if other != first:
                raise UserError(
                    f"sweep on slurm: the nodes to avoid differ between points ({first[1]} vs "
                    f"{other[1]}: allow_nodes): a sweep is one job array with one --exclude; "
                    "sweep allow_nodes in separate `treb run`s"
                )
    except UserError as exc:  # the runs are recorded: they end, never PENDING forever
        _fail(subs, str(exc))
        raise
    return first


def _sbatch(subs: list[Submission], path: Path) -> str:
    from trebuchet.backends.slurm.engine import call_sbatch

    job_id, why = call_sbatch(path, subs[0].loaded.workdir, "the job array")
    if job_id:
        return job_id
    _fail(subs, why)
    raise UserError(why)


def _fail(subs: list[Submission], why: str) -> None:
    for sub in subs:
        lifecycle.ended(sub.store, sub.record.id, FAILED, why, "sbatch_failed", attempt=0)


def follow(backend: Any, store: Any, job_id: str, runs: list[dict[str, Any]]) -> tuple[int, int]:
    """Stream every point's logs until all have ended: (runs not SUCCEEDED, signal or 0).

    One refresh (one squeue call) per poll for all points; Ctrl+C cancels the whole array
    (one scancel), a second Ctrl+C kills it."""
    from trebuchet.backends.slurm.engine import POLL_S, streams
    from trebuchet.view.live import View

    view = View()
    sig = {"n": 0, "presses": 0}

    def on_signal(signum: int, _frame: object) -> None:
        sig.update(n=signum, presses=sig["presses"] + 1)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    shown: dict[str, str] = {}
    done: set[str] = set()
    failed = 0
    cancelled_at: float | None = None
    try:
        for run in runs:
            view.add(f"{run['index']}|batch", Path(run["run_dir"]) / "batch.log")
        next_poll = 0.0
        while len(done) < len(runs):
            now = time.monotonic()
            if sig["n"] and cancelled_at is None:
                view.say(f"cancelling Slurm job array {job_id}")
                cancel_array(job_id, [Path(r["run_dir"]) for r in runs])
                cancelled_at = now
            if now >= next_poll:
                next_poll = now + POLL_S
                recs = [store.get(r["id"]) for r in runs]
                backend.refresh(store, [r for r in recs if r is not None])
                for run in runs:
                    rec = store.get(run["id"])
                    if rec is None or run["id"] in done:
                        continue
                    for label, name in streams(rec):
                        path = Path(run["run_dir"]) / f"attempt-{rec.attempt}" / name
                        view.add(f"{run['index']}|{label}", path)
                    if rec.state in TERMINAL:
                        done.add(run["id"])
                        failed += int(rec.state != SUCCEEDED)
                        view.say(
                            f"sweep point {run['index']} ({run['id']}, Slurm job "
                            f"{rec.backend_id}) {rec.state}: {point_text(run['params'])}"
                        )
                    elif shown.get(run["id"]) != rec.state:
                        shown[run["id"]] = rec.state
                        view.say(
                            f"sweep point {run['index']} ({rec.backend_id}) {rec.state.lower()}"
                        )
            if cancelled_at is not None and (sig["presses"] > 1 or now - cancelled_at > 60):
                if sig["presses"] > 1:
                    cancel_array(job_id, [], "KILL")
                for run in runs:
                    if run["id"] not in done:
                        lifecycle.ended(store, run["id"], CANCELLED, "treb cancel")
                        failed += 1
                break
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        view.close()
    return failed, sig["n"]


def cancel_array(job_id: str, run_dirs: list[Path], sig: str | None = None) -> None:
    """One scancel for the whole array; the markers tell each task's trap it was treb."""
    for run_dir in run_dirs:
        write_atomic(run_dir / "cancel-requested", f"{time.time()}\n")
    scancel([job_id], sig)


def scancel(ids: list[str], sig: str | None = None) -> None:
    cmd = ["scancel", *([f"--signal={sig}", "--full"] if sig else []), *ids]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"scancel failed: {exc}") from None
    benign = ("Invalid job id", "already completing or completed")
    errors = [x for x in res.stderr.splitlines() if x.strip() and not any(b in x for b in benign)]
    if res.returncode != 0 and errors:
        raise UserError(f"scancel {' '.join(ids)} failed: {errors[-1].strip()}")


def _job(run: Any) -> str:
    return str(run.backend_id or "").split("_", 1)[0]


def _marked(run: Any) -> bool:
    return (Path(run.run_dir) / "cancel-requested").exists()


def cancel_point(store: Any, run: Any) -> None:
    """scancel one sweep point's array task, with the points of the same array that `treb
    cancel SWEEP` marked CANCELLED while queued (they are still in Slurm's queue); the whole
    array with one id when nothing else of it is left running."""
    members = [r for r in store.sweep_runs(run.sweep_id) if _job(r) == _job(run)]
    take = [run] + [
        r for r in members
        if r.id != run.id and r.state == CANCELLED and r.backend_id and not _marked(r)
    ]  # fmt: skip
    rest = [r for r in members if r.id not in {t.id for t in take} and r.state not in TERMINAL]
    for r in take:
        write_atomic(Path(r.run_dir) / "cancel-requested", f"{time.time()}\n")
    # Queued tasks first: none of them may start once a running one is gone.
    scancel([_job(run)] if not rest else [str(r.backend_id) for r in take[1:] + take[:1]])


def cancel_sweep(backend: Any, store: Any, runs: list[Any]) -> None:
    """Cancel these sweep points: one scancel per job array (its job id when every active
    task of it is cancelled), then wait until each has ended (one squeue per poll)."""

    from trebuchet.backends.slurm.state import cancel_wait_s

    wait = cancel_wait_s()  # a bad value named before anything is signalled
    active = [r for r in runs if r.state not in TERMINAL]
    arrays: dict[str, list[Any]] = {}
    for r in active:
        write_atomic(Path(r.run_dir) / "cancel-requested", f"{time.time()}\n")
        if r.backend_id:
            arrays.setdefault(_job(r), []).append(r)
    ids: list[str] = []
    for job, members in arrays.items():
        others = [
            r for r in store.sweep_runs(members[0].sweep_id)
            if _job(r) == job and r.state not in TERMINAL and r.id not in {m.id for m in members}
        ] if members[0].sweep_id else [None]  # fmt: skip
        ids += [job] if not others else [str(m.backend_id) for m in members]
    if ids:
        scancel(ids)
    deadline = time.time() + wait
    left = [r for r in active if r.backend_id]
    while left and time.time() < deadline:
        backend.refresh(store, left)
        left = [r for r in (store.get(x.id) for x in left) if r is not None and r.active]
        if left:
            time.sleep(0.5)
    for r in active:
        lifecycle.ended(store, r.id, CANCELLED, "treb cancel")
