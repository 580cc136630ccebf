"""The Slurm engine: render an sbatch script, submit it, follow it, cancel it.

Why it is shaped this way: the job itself writes every outcome (runtime/slurm/step.py) into the
run directory on the shared filesystem, so following a run costs one squeue call per poll
for all of the user's active runs (never one per run, never sacct unless Slurm keeps no
other trace) plus reading small files; `treb logs -f` reads the rank logs directly.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import Backend, SpecPoint, SubmissionPoint, Submitted, SweepSubmitted
from trebuchet.backends.slurm import dependency
from trebuchet.backends.slurm import state as st
from trebuchet.backends.slurm.avoid import exclude
from trebuchet.backends.slurm.script import CONTROL, problems, render_all, write_job
from trebuchet.envs.build import BuildError, ensure, missing_tool
from trebuchet.envs.recipe import Recipe, recipe_for
from trebuchet.errors import SpecError, TrebError, UserError
from trebuchet.runtime.process.procs import hostname
from trebuchet.store import lifecycle
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event, write_atomic
from trebuchet.store.paths import runs_dir
from trebuchet.store.states import (
    CANCELLED,
    FAILED,
    LOST,
    SUCCEEDED,
    TERMINAL,
    describe_waiting,
    first_failure,
)

if TYPE_CHECKING:  # `treb ps` refreshes slurm runs: it must not import pydantic
    from trebuchet.launcher.submit import Submission
    from trebuchet.preflight.context import Context
    from trebuchet.preflight.findings import Finding
    from trebuchet.spec.load import LoadedSpec

ORPHAN_PENDING_S = 120.0  # a run recorded this long ago without a job id never reached sbatch
SQUEUE_MIN_INTERVAL_S = 1.0  # one process asks squeue at most this often (slurmctld's RPCs)
POLL_S = 1.0  # attached runs: how often the state is refreshed
SQUEUE_SILENT_WARN_S = 60.0  # attached runs: say so when squeue fails this long


def call_sbatch(path: Path, cwd: Path, what: str) -> tuple[str | None, str]:
    """(job id, "") from `sbatch --parsable`, or (None, why it was not accepted)."""
    try:
        res = subprocess.run(
            ["sbatch", "--parsable", str(path)], cwd=cwd, capture_output=True, text=True,
            timeout=120, start_new_session=True,  # a Ctrl+C is treb's (held_signals)
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"sbatch did not answer: {exc}"
    job_id = res.stdout.strip().split(";")[0]
    if res.returncode == 0 and job_id.isdigit():
        return job_id, ""
    why = res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}"
    return None, f"sbatch refused {what}: {why.splitlines()[-1]}"


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM held (the signals that came, in order) while a job is submitted:
    a Ctrl+C then would lose the id of a job sbatch had already handed to slurmctld, which
    would run with no run knowing it. sbatch runs in a session of its own (call_sbatch),
    out of the terminal's reach. Outside the main thread (no handler there): nothing held."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def hold(signum: int, _frame: object) -> None:
        if not pressed:  # answered at once: sbatch may take its time (up to its timeout)
            print("treb: interrupted: waiting for sbatch to answer, then its job is cancelled",
                  file=sys.stderr, flush=True)  # fmt: skip
        pressed.append(signum)

    held = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, hold) for s in held}
    try:
        yield pressed
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class SlurmBackend(Backend):
    name = "slurm"
    faults = True
    node_checks = True
    sweeps = True
    shared_run_dir = True  # TREB_HOME must be on the shared filesystem
    slurm_environment = True

    def __init__(self) -> None:
        self.cancel_signal: int | None = None
        self._queue_cache: tuple[float, frozenset[str], dict[str, st.QueueInfo]] | None = None
        self.queue_ok_at = time.monotonic()  # when squeue last answered
        self._partitions: dict[str, dict[str, str] | None] = {}  # scontrol's, per partition

    # -- checks and rendering --------------------------------------------------------------
    def check(self, loaded: LoadedSpec) -> None:
        """What `treb run --on slurm` needs: a spec Slurm can run, the tool that builds its
        environment here, and sbatch."""
        self._check_spec(loaded)
        why = self._missing_tool(loaded)
        if why:
            raise UserError(why)
        exclude(loaded.spec, say=False)  # its settings and sbatch_args, before a run is recorded
        if loaded.after:
            dependency.refuse(loaded.after)
        if not shutil.which("sbatch"):
            raise UserError(
                "--on slurm: sbatch is not on PATH (run treb where Slurm's commands work, "
                "e.g. a login node; `treb render --on slurm` shows the script anywhere)"
            )

    def _check_spec(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        env = spec.environment
        if spec.launcher == "horovod":  # placed by Slurm as mpirun is (runtime/node/horovodrun.py)
            from trebuchet.runtime.node.horovodrun import slurm_problem

            bad = slurm_problem(dict(spec.env))
            if bad:
                raise loaded.refusal(*bad)
        mpi = spec.launcher in ("mpirun", "horovod")  # one mpirun for the whole job
        if mpi and (spec.spare_nodes or spec.min_nodes is not None):
            raise loaded.refusal(
                "spare_nodes" if spec.spare_nodes else "nodes",
                "spare nodes and a node range are not supported with mpirun on the slurm "
                "backend (OpenMPI's daemons take every node of the allocation); use native "
                "or torchrun",
            )
        if mpi and env is not None and env.image:
            raise loaded.refusal(
                "launcher",
                f"{spec.launcher} with a container image is not supported "
                "by the slurm backend (OpenMPI's daemons on the other nodes "
                "would run outside it); use native (srun starts every rank "
                "in the container)",
            )
        found = [f"{loaded.where(*path)}: {'.'.join(path)}: {why}" for path, why in problems(spec)]
        if found:
            raise SpecError(found)
        home = str(runs_dir())
        if CONTROL.search(home) or '"' in home:
            raise UserError(f"TREB_HOME {home!r}: Slurm's --output cannot name this path")

    def recipe(self, loaded: LoadedSpec) -> Recipe | None:
        """A venv or conda env is built on the submitting host under TREB_HOME, which the
        nodes share; vendor files follow gpu_vendor (the login node may have no GPU)."""
        spec = loaded.spec
        if spec.environment is None or spec.environment.image:
            return None
        vendor = spec.gpu_vendor if spec.gpu_vendor != "auto" else "none"
        return recipe_for(spec, loaded.base, vendor)

    def _missing_tool(self, loaded: LoadedSpec) -> str | None:
        """`file:line: field: why` when this host lacks what builds the environment (conda,
        the Python version): `treb run` refuses, a render only warns."""
        recipe = self.recipe(loaded)  # built here, on the submitting host, in TREB_HOME
        if recipe and (missing := missing_tool(recipe)):
            field, why = missing
            return f"{loaded.where(*field)}: {'.'.join(field)}: {why}"
        return None

    def render(self, loaded: LoadedSpec) -> str:
        """The script and job.json; a render is a dry run, so a tool missing on this host
        (conda for an imported madengine model, say) is a warning on stderr, not a refusal."""
        self._check_spec(loaded)
        why = self._missing_tool(loaded)
        if why:
            sys.stderr.write(
                f"treb render: warning: {why}; the script names the tool as it would be "
                "found, and `treb run --on slurm` refuses until this host has it\n"
            )
        placeholder = runs_dir() / "RUN_ID"
        if loaded.after:
            dependency.refuse(loaded.after)
        deps = dependency.sbatch_lines(loaded.after or [])
        deps += exclude(loaded.spec)[0]  # nodes with a bad history (docs/nodes.md)
        return render_all(loaded.spec, loaded.workdir, "RUN_ID", placeholder, self.recipe(loaded),
                          deps)  # fmt: skip

    def preflight(self, ctx: Context) -> list[Finding]:
        from trebuchet.backends.slurm.checks import CHECKS

        return [f for check in CHECKS for f in check(ctx)]

    def time_limit(self, loaded: LoadedSpec) -> tuple[float | None, tuple[str, ...]] | None:
        from trebuchet.backends.slurm.checks import time_limit

        return time_limit(loaded.spec)

    # -- sweeps: one job array (array.py) ---------------------------------------------------
    def check_sweep(self, points: list[SpecPoint]) -> None:
        from trebuchet.backends.slurm.array import check_shape

        check_shape(points)

    def render_sweep(self, points: list[SpecPoint]) -> str:
        parallel = points[0][1].spec.sweep_parallel
        limit = f", at most {parallel} at once" if parallel else ""
        head = (f"# sweep: {len(points)} runs, submitted as one Slurm job array{limit}; "
                "array task i runs point i's script below\n")  # fmt: skip
        return head + super().render_sweep(points)

    def submit_sweep(
        self, sweep_id: str, points: list[SubmissionPoint], attach: bool
    ) -> SweepSubmitted:
        from trebuchet.backends.slurm.array import submit_sweep

        return submit_sweep(self, sweep_id, points, attach)

    # -- submission --------------------------------------------------------------------------
    def submit(self, sub: Submission, attach: bool) -> Submitted:
        try:  # Ctrl+C before sbatch: the recorded run ends CANCELLED, not PENDING (then LOST)
            recipe, deps, avoid = self._before_sbatch(sub)
        except KeyboardInterrupt:
            lifecycle.ended(sub.store, sub.record.id, CANCELLED, "cancelled before it was "
                            "submitted (Ctrl+C)", attempt=0)  # fmt: skip
            raise
        if deps is None:
            return Submitted(sub.record.id, CANCELLED)
        with held_signals() as pressed:  # the job id first: no job of ours runs unknown
            path = write_job(sub.loaded.spec, sub.loaded.workdir, sub.record.id, sub.run_dir,
                             recipe, dependency.sbatch_lines(deps) + avoid)  # fmt: skip
            job_id = self._sbatch(sub, path)
            sub.store.update_run(sub.record.id, backend_id=job_id, host=hostname())
            append_event(sub.run_dir, "sbatch", job_id=job_id, backend_id=job_id)
        print(f"treb: Slurm job {job_id}; script {path}", file=sys.stderr)
        if pressed:  # Ctrl+C (or SIGTERM) while sbatch ran: that job is cancelled at once
            print(f"treb: interrupted while submitting: cancelling Slurm job {job_id}",
                  file=sys.stderr)  # fmt: skip
            rec = sub.store.get(sub.record.id) or sub.record
            self._scancel(rec)
            lifecycle.ended(sub.store, rec.id, CANCELLED, "cancelled while it was submitted "
                            "(Ctrl+C)", attempt=0)  # fmt: skip
            self.cancel_signal = pressed[0]
            return Submitted(rec.id, CANCELLED, None, pressed[0])
        if not attach:
            return Submitted(sub.record.id)
        rec = sub.store.get(sub.record.id) or sub.record
        state = self._attach(sub.store, rec)
        rec = sub.store.get(sub.record.id) or rec
        return Submitted(rec.id, state, rec.exit_code, self.cancel_signal)

    def _before_sbatch(
        self, sub: Submission
    ) -> tuple[Recipe | None, list[dict[str, Any]] | None, list[str]]:
        """The environment built, the dependencies decided (None: not submitted), the
        nodes to avoid (docs/nodes.md): what the job's script needs."""
        recipe = self.recipe(sub.loaded)
        if recipe:  # built (or reused) before the job is queued; the nodes use it in place
            self.build_environment(sub, recipe)
        deps = self._dependencies(sub)
        if deps is None:
            return recipe, None, []
        try:  # nodes with a bad history (docs/nodes.md)
            avoid, hosts = exclude(sub.loaded.spec, sub.store)
        except UserError as exc:  # the run is recorded: it ends, never PENDING forever
            lifecycle.ended(sub.store, sub.record.id, FAILED, str(exc), "sbatch_failed", attempt=0)
            raise
        if hosts:
            append_event(sub.run_dir, "nodes_avoided", hosts=hosts, how="sbatch --exclude")
        return recipe, deps, avoid

    def _dependencies(self, sub: Submission) -> list[dict[str, Any]] | None:
        """--after: the Slurm jobs the job still waits for (those that ended are decided
        now, as Slurm forgets finished jobs); None when one already ended otherwise than
        asked: the run is recorded CANCELLED with the reason, and nothing is submitted."""
        deps = sub.loaded.after or []
        if not deps:
            return []
        active = [r for d in deps if (r := sub.store.get(d["run"])) is not None and r.active]
        if active:
            self.refresh(sub.store, active)
        left, why = dependency.still_waiting(sub.store, deps)
        if why:
            lifecycle.ended(sub.store, sub.record.id, CANCELLED, why, attempt=0, waiting=None)
            print(f"treb: run {sub.record.id} not submitted: {why}", file=sys.stderr)
        return None if why else left

    def build_environment(self, sub: Submission, recipe: Recipe) -> None:
        """Build (or reuse) a run's venv or conda env here, before its job is queued; a
        failure ends the run FAILED and raises TrebError."""
        log_path = sub.run_dir / "environment.log"
        print(f"treb: environment {recipe.name} ({recipe.kind}): building or reusing",
              file=sys.stderr)  # fmt: skip
        try:
            with open(log_path, "a") as log:
                info = ensure(recipe, log)
        except (BuildError, OSError) as exc:
            why = f"environment build failed: {exc}"
            lifecycle.record(sub.store, sub.record.id, "environment_failed", error=str(exc))
            sub.store.set_attempt(sub.record.id, 0, state=FAILED, ended_at=time.time(), reason=why)
            raise TrebError(why) from None
        append_event(sub.run_dir, "environment_ready", reused=info.get("reused"),
                     stamp=recipe.stamp, prefix=recipe.prefix)  # fmt: skip

    def _sbatch(self, sub: Submission, path: Path) -> str:
        job_id, why = call_sbatch(path, sub.loaded.workdir, "the job")
        if job_id:
            return job_id
        lifecycle.ended(sub.store, sub.record.id, FAILED, why, "sbatch_failed", attempt=0)
        raise UserError(why)

    # -- following ---------------------------------------------------------------------------
    def _queue(self, job_ids: list[str]) -> dict[str, st.QueueInfo] | None:
        """squeue for these jobs: one call, reused for SQUEUE_MIN_INTERVAL_S in a process."""
        wanted = frozenset(job_ids)
        now = time.monotonic()
        cache = self._queue_cache
        if cache and now - cache[0] < SQUEUE_MIN_INTERVAL_S and wanted <= cache[1]:
            return cache[2]
        jobs = st.squeue_jobs(sorted(wanted))
        if jobs is not None:
            self._queue_cache = (now, wanted, jobs)
            self.queue_ok_at = now
        return jobs

    def refresh(self, store: Store, runs: list[RunRecord]) -> None:
        """One squeue call for every active run given, then each run's records."""
        active = [r for r in runs if r.active and r.backend == self.name]
        if not active:
            return
        queue = self._queue([r.backend_id for r in active if r.backend_id])
        gone: list[RunRecord] = []
        for rec in active:
            if not self._update(store, rec, queue):
                gone.append(rec)
        if gone and shutil.which("sacct"):  # forgotten by squeue: ask accounting, once
            queue = {**(queue or {}), **st.sacct_jobs([str(r.backend_id) for r in gone])}
        for rec in gone:
            self._finish(store, rec, st.read_job_files(Path(rec.run_dir)), queue or {})

    def _update(self, store: Store, rec: RunRecord, queue: dict[str, st.QueueInfo] | None) -> bool:
        """Bring one run up to date; False when its job is gone and needs a final look."""
        now = time.time()
        if not rec.backend_id:
            if now - rec.created_at > ORPHAN_PENDING_S:
                lifecycle.ended(store, rec.id, LOST, "never reached sbatch", "lost", attempt=0)
            return True
        files = st.read_job_files(Path(rec.run_dir))
        self._store_attempts(store, rec, files)
        if queue is None:  # squeue did not answer: nothing can be concluded
            return True
        info = queue.get(rec.backend_id)
        live = st.live_state(info, files) if info else None
        if live:
            values: dict[str, Any] = {"attempt": files.last_attempt or 0}
            waiting = self._waiting(rec, info) if info and info.state in st.PENDING_STATES else None
            if waiting != rec.waiting:
                values["waiting"] = waiting
            if rec.started_at is None and files.attempts:
                values["started_at"] = files.attempts[min(files.attempts)].get("started_at")
            lifecycle.record(store, rec.id, "state", values, state=live, known=rec,
                             job=rec.backend_id)  # fmt: skip
            return True
        if info is None and files.result is None:
            return False
        cancelled = (Path(rec.run_dir) / "cancel-requested").exists()
        if info is not None and st.settling(files, info, now, cancelled):
            return True  # maybe a requeue on its way back to PENDING: look again later
        self._finish(store, rec, files, queue)
        return True

    def _waiting(self, rec: RunRecord, info: st.QueueInfo) -> dict[str, Any] | None:
        """Why the job is pending, in plain words; the partition's facts are asked for
        only when a new reason needs them (a run keeps its explanation while it holds)."""
        from trebuchet.backends.slurm import reasons as why

        if rec.waiting and rec.waiting.get("reason") == info.reason.strip():
            return rec.waiting
        if info.reason.strip() == "Dependency":  # --after: the runs it waits for, by name
            from trebuchet.store import after

            deps = after.read(rec.run_dir)
            if deps:
                return {**after.waiting(deps), "source": "slurm", "reason": "Dependency"}
        facts = None
        if why.needs_facts(info.reason):
            if info.partition not in self._partitions:
                self._partitions[info.partition] = why.partition_facts(info.partition)
            facts = self._partitions[info.partition]
        return why.explain(info.reason, info.partition, rec.nodes, info.time_limit, facts)

    def _store_attempts(self, store: Store, rec: RunRecord, files: st.JobFiles) -> None:
        granted = max((a.get("max_attempts") or 0 for a in files.attempts.values()), default=0)
        if isinstance(granted, int) and granted > rec.max_attempts:  # log policies' retries
            store.update_run(rec.id, max_attempts=granted)
        for n, att in sorted(files.attempts.items()):
            store.set_attempt(
                rec.id, n, state=att.get("state") or "RUNNING", started_at=att.get("started_at"),
                ended_at=att.get("ended_at"), reason=att.get("reason") or None,
            )  # fmt: skip
            ended = att.get("state") not in (None, "RUNNING") or files.result is not None
            store.set_procs(rec.id, n, files.records.get(n, []), attempt_ended=ended)

    def _finish(
        self, store: Store, rec: RunRecord, files: st.JobFiles, queue: dict[str, st.QueueInfo]
    ) -> None:
        """The job has ended (or vanished): its final state, root cause and exit code."""
        state, reason = st.final_state(files, queue.get(str(rec.backend_id)), str(rec.backend_id))
        marker = Path(rec.run_dir) / "cancel-requested"
        result = files.result or {}
        if (
            marker.exists()
            and result.get("source") == "signal"
            and result.get("state") == CANCELLED
        ):
            state, reason = CANCELLED, result.get("reason")  # treb cancel: whatever Slurm says
        if state == CANCELLED and files.result is None and marker.exists():
            reason = "cancelled (treb cancel) before the job started"
        elif files.result is None and not files.attempts:
            why = self._dependency_failed(store, rec)
            if why:  # Slurm ended it: --kill-on-invalid-dep
                state, reason = CANCELLED, why
        last = files.last_attempt
        now = time.time()
        ff = None
        failed = result.get("failed_attempt")  # cancelled with its retry pending
        if state == CANCELLED and isinstance(failed, int) and failed in files.records:
            found = first_failure(files.records[failed])
            ff = {**found, "attempt": failed} if found else None
        elif state == FAILED and last is not None:
            found = first_failure(files.records.get(last, []))
            if found:
                ff = {**found, "attempt": last}
        exit_code = 0 if state == SUCCEEDED else (ff or {}).get("exit_code")
        if exit_code is None and isinstance(result.get("exit_code"), int):
            exit_code = result["exit_code"]
        n = 0 if last is None else last
        att = files.attempts.get(n, {})
        if att.get("state") in (None, "RUNNING") or state == LOST:
            store.set_attempt(rec.id, n, state=state, ended_at=now, reason=reason)
        started = files.attempts[min(files.attempts)].get("started_at") if files.attempts else None
        index = {"attempt": n, "exit_code": exit_code, "first_failure": ff,
                 "started_at": rec.started_at or started, "waiting": None}  # fmt: skip
        lifecycle.record(store, rec.id, "run_ended", index, reason=reason, known=rec,
                         time=result.get("ended_at") or now, state=state)  # fmt: skip

    def _dependency_failed(self, store: Store, rec: RunRecord) -> str | None:
        """Why a job that never started can never start: a run it waited for (--after)
        ended otherwise than asked (`dependency RUN failed`); None when none did."""
        from trebuchet.store import after

        deps = after.read(rec.run_dir)
        if not deps:
            return None
        active = [r for d in deps if (r := store.get(d["run"])) is not None and r.active]
        if active:
            self.refresh(store, active)
        return after.verdict(store, deps)[1]

    def _attach(self, store: Store, rec: RunRecord) -> str:
        """Stream the logs until the job ends; Ctrl+C (or SIGTERM) cancels the job."""
        from trebuchet.view.live import View

        view = View()
        run_dir = Path(rec.run_dir)
        self.cancel_signal = None
        cancelled_at: float | None = None
        give_up_s = 60.0  # after the cancel, the run is ended here if Slurm has not said
        presses = 0
        shown = waited = ""
        warned_at = 0.0
        self.queue_ok_at = time.monotonic()

        def on_signal(signum: int, _frame: object) -> None:
            nonlocal presses
            presses += 1
            self.cancel_signal = signum

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            view.add("batch", run_dir / "batch.log")
            next_poll = 0.0
            while True:
                now = time.monotonic()
                if self.cancel_signal is not None and cancelled_at is None:
                    grace = self._interrupt(rec, view) if self.cancel_signal == signal.SIGINT \
                        else None  # fmt: skip
                    if grace is None:
                        view.say(f"cancelling Slurm job {rec.backend_id}")
                        self._scancel(rec)
                    else:
                        give_up_s = max(give_up_s, 2 * grace + 30.0)
                    cancelled_at = now
                if now >= next_poll:
                    next_poll = now + POLL_S
                    self.refresh(store, [rec])
                    rec = store.get(rec.id) or rec
                    if rec.state != shown and rec.state not in TERMINAL:
                        shown = rec.state
                        view.say(
                            f"Slurm job {rec.backend_id} {shown.lower()}"
                            f"{f' (attempt {rec.attempt + 1})' if rec.attempt else ''}"
                        )
                    waiting = rec.waiting if rec.state not in TERMINAL else None
                    meaning = (waiting or {}).get("meaning") or ""
                    if meaning and meaning != waited:  # a new reason in the same words: quiet
                        stop = "" if waiting and waiting.get("starts") else "; Ctrl+C cancels it"
                        view.say(f"Slurm job {rec.backend_id}: {describe_waiting(waiting)}{stop}")
                    waited = meaning
                    for label, name in streams(rec):
                        view.add(label, run_dir / f"attempt-{rec.attempt}" / name)
                if rec.state in TERMINAL:
                    break
                silent = now - self.queue_ok_at
                if silent > SQUEUE_SILENT_WARN_S and now >= warned_at + SQUEUE_SILENT_WARN_S:
                    warned_at = now
                    view.say(f"squeue has not answered for {silent:.0f}s (slurmctld down? "
                             f"SLURM_CONF?); still following job {rec.backend_id}; Ctrl+C "
                             "cancels it")  # fmt: skip
                if cancelled_at is not None and (presses > 1 or now - cancelled_at > give_up_s):
                    if presses > 1:
                        self._scancel(rec, "KILL")
                    _give_up(store, rec.id, "treb cancel (Ctrl+C)")
                    break
                time.sleep(0.1)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            view.close()
        rec = store.get(rec.id) or rec
        return rec.state

    # -- cancel ------------------------------------------------------------------------------
    def _interrupt(self, rec: RunRecord, view: Any) -> float | None:
        """Ctrl+C on an attached run whose job controller runs an attempt: SIGINT to the
        controller alone, which hands it on as torchrun does (runtime/slurm/step.py: SIGINT
        to the ranks, SIGTERM after the grace period, SIGKILL after another) and ends the
        run CANCELLED, the job too (its own scancel). The grace period, or None (scancel)."""
        grace = self._signal_controller(rec, "INT")
        if grace is not None:
            view.say(f"interrupted: SIGINT to the ranks of Slurm job {rec.backend_id}; SIGTERM "
                     f"to what still runs in {grace:g}s, SIGKILL in {2 * grace:g}s; Ctrl+C "
                     "again to kill them now")  # fmt: skip
        return grace

    def _signal_controller(self, rec: RunRecord, sig: str) -> float | None:
        """`sig` to the job's controller alone (`scancel --signal=SIG --batch`), which
        stops the ranks as a local cancel does (the spec's grace period, not Slurm's
        KillWait) and ends the run and the job CANCELLED. The grace period, or None when
        the job runs no attempt yet (pending, or its script still sets up), has ended, or
        scancel refused: then the caller scancels."""
        run_dir = Path(rec.run_dir)
        files = st.read_job_files(run_dir)
        if not rec.backend_id or not files.attempts or files.result is not None:
            return None
        try:
            grace = float(json.loads((run_dir / "job.json").read_text())["grace"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        write_atomic(run_dir / "cancel-requested", f"{time.time()}\n")
        cmd = ["scancel", f"--signal={sig}", "--batch", rec.backend_id]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return grace if res.returncode == 0 else None

    def _scancel(self, rec: RunRecord, sig: str | None = None) -> None:
        """One scancel; the marker file tells the job's own trap that it was cancelled."""
        write_atomic(Path(rec.run_dir) / "cancel-requested", f"{time.time()}\n")
        if not rec.backend_id:
            return
        cmd = ["scancel", *([f"--signal={sig}", "--full"] if sig else []), rec.backend_id]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UserError(f"scancel failed: {exc}") from None
        if res.returncode != 0 and "Invalid job id" not in res.stderr:
            raise UserError(f"scancel {rec.backend_id} failed: {res.stderr.strip()}")

    def fault_nodes(self, run: RunRecord) -> list[str]:
        from trebuchet.backends.slurm import fault

        return fault.nodes(run)

    def inject_fault(self, run: RunRecord, action: str, target: str | None, node: int | None,
                     host: str | None) -> int:  # fmt: skip
        from trebuchet.backends.slurm import fault

        return fault.inject(run, action, target, host)

    def check_nodes(self, folder: Path, n: int, conf: dict[str, Any], workdir: str, spec: Any,
                    token: str) -> list[dict[str, Any]]:  # fmt: skip
        from trebuchet.backends.slurm.node_check import check

        return check(folder, n, spec, token)

    def cancel(self, store: Store, run: RunRecord) -> None:
        wait = st.cancel_wait_s()  # a bad value named before anything is signalled
        if run.sweep_id and "_" in (run.backend_id or ""):  # a task of a sweep's job array
            from trebuchet.backends.slurm.array import cancel_point

            cancel_point(store, run)
            grace = None
        else:  # as a local cancel: SIGTERM, the spec's grace period, SIGKILL (the controller)
            grace = self._signal_controller(run, "TERM")
            if grace is None:
                self._scancel(run)
        if not run.backend_id:  # never reached sbatch: nothing runs anywhere
            lifecycle.ended(store, run.id, CANCELLED, "treb cancel before sbatch")
            return
        deadline = time.time() + wait + (2 * grace if grace is not None else 0.0)
        while time.time() < deadline:
            self.refresh(store, [run])
            rec = store.get(run.id)
            if rec is None or rec.state in TERMINAL:
                return
            time.sleep(0.5)
        if grace is not None:  # the controller did not end it: Slurm's own cancel
            self._scancel(run)
        _give_up(store, run.id, "treb cancel: Slurm did not say in time")

    def cancel_sweep(self, store: Store, runs: list[RunRecord]) -> None:
        """`treb cancel SWEEP`: one scancel for a sweep's job array, then wait for all."""
        from trebuchet.backends.slurm.array import cancel_sweep

        cancel_sweep(self, store, runs)

    # -- diagnosis ---------------------------------------------------------------------------
    def explain_ending(self, run: dict[str, Any]) -> dict[str, Any] | None:
        """A job sbatch refused, or one that left the queue without an outcome."""
        from trebuchet.backends.slurm.diagnosis import explain

        return explain(run)


def _give_up(store: Store, run_id: str, reason: str) -> None:
    """A cancelled run ended here, its job's controller silent (hung, stopped, SIGKILLed by
    a second Ctrl+C): its open attempt ends with it, or `treb status` shows that attempt
    RUNNING for ever under a CANCELLED run (an ended run is no longer refreshed)."""
    rows = store.attempts(run_id)
    open_ = [a["attempt"] for a in rows if a.get("state") in (None, "RUNNING")]
    lifecycle.ended(store, run_id, CANCELLED, reason, attempt=open_[-1] if open_ else None)


def streams(rec: RunRecord) -> list[tuple[str, str]]:
    """(label, log file name) of every process of an attempt, as the local backend shows them."""
    ppn = max(1, rec.procs_per_node)
    out: list[tuple[str, str]] = []
    for node in range(rec.nodes):
        if rec.launcher != "native" and (node == 0 or rec.launcher not in ("mpirun", "horovod")):
            out.append((str(node), f"node-{node}.log"))  # mpirun: one, on the first node
        if rec.launcher != "none":
            out += [(f"{node}:{i}", f"rank-{node * ppn + i}.log") for i in range(ppn)]
    return out


BACKEND = SlurmBackend()
