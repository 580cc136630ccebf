"""Pick the root cause among the ranks, in order:
1. the run's state by itself (cancelled, time limit, supervisor lost), and what the
   scheduler said about the whole job before any task failed;
2. the first failing process, when its own log explains it;
3. else its death by signal (SIGKILL with no launcher kill: the OOM killer; SIGSEGV...);
4. else the earliest cause any rank's log shows (a rank can hit CUDA OOM and hang while
   the others time out first);
5. else a collective timeout, blamed on the rank that never joined when the logs tell;
6. else the first failure's exit code and last error-looking lines (unknown).

Ranks stopped by the launcher, or by SIGTERM after another failed, are the cascade and
never the root cause.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trebuchet.diagnose import catalog
from trebuchet.diagnose.catalog import CASCADE, CAUSE, TIMEOUT
from trebuchet.diagnose.classify import Finding, Hit, classify, exit_abort
from trebuchet.diagnose.errorfile import RankError
from trebuchet.diagnose.lines import visible
from trebuchet.diagnose.sources import SLURM_OUT_NAME, TORCHRUN_STOPPED, Case, Unit, srun_stop
from trebuchet.runtime.rundir.records import left_first_how
from trebuchet.runtime.rundir.regular import open_regular

if TYPE_CHECKING:
    from trebuchet.runtime.contracts.schema import Outcome

NO_TS = float("inf")
# A time limit reached after the ranks wrote nothing for this long, or for this share of
# the attempt (whichever is shorter), is called likely hung.
HUNG_SILENCE_S = 600.0
HUNG_SHARE = 0.5
LOOPBACK = re.compile(r"\b127\.\d+\.\d+\.\d+|\[::1\]")
# A job id (sources.SLURM_OUT_NAME): an array task's is sbatch's %A_%a, which sacct takes
# as it is (`sacct -j 7_3` is that task, `-j 7` all of the array's).
# the job srun ran in, in its own words (api/allocate.c; step_launch.c's %ps)
SRUN_JOB = re.compile(
    r"^(?:srun|salloc): job (?P<job>[0-9]{1,10}) (?:queued and waiting for resources"
    r"|has been allocated resources)$"
    r"|^srun: Force Terminated (?:StepId|JobId)=(?P<step>[0-9]{1,10})\b"
)
# slurmstepd saying the step failed (slurmstepd/req.c): Slurm did say why, a task failed
STEP_FAILED = re.compile(
    r"\*\*\* (?:JOB|STEP) \S+ ON \S+ (?:FAILED \(|CANCELLED AT \S+ DUE TO TASK FAILURE)"
)


@dataclass
class Diagnosis:
    category: str | None  # None: nothing failed (or not yet)
    summary: str
    rank: int | None = None
    node: str | None = None
    evidence: list[str] = field(default_factory=list)
    frame: str | None = None
    log: str | None = None
    units: list[Unit] = field(default_factory=list)
    roles: dict[int, str] = field(default_factory=dict)  # id(unit) -> role
    source: str = ""
    notes: list[str] = field(default_factory=list)
    run: dict[str, Any] | None = None
    fix: str | None = None  # the catalog's remedy fitted to this run (fit_remedy)
    error: RankError | None = None  # the root cause's own error file (torch's @record)
    missing: set[int] = field(default_factory=set)  # ranks that never joined a collective

    @property
    def remedy(self) -> str:
        return self.fix or catalog.REMEDIES.get(self.category or "", "")

    def root_json(self) -> dict[str, Any] | None:
        if self.category is None:
            return None
        return {
            "rank": self.rank, "node": self.node, "category": self.category,
            "summary": self.summary, "remedy": self.remedy, "evidence": self.evidence,
            "error": self.error.to_json() if self.error else None,
        }  # fmt: skip

    def ranks_json(self) -> list[dict[str, Any]]:
        out = []
        for u in self.units:
            best = u.finding.best if u.finding else None
            out.append({
                "rank": u.rank, "node": u.node, "local_rank": u.local_rank,
                "exit_code": u.exit_code, "signal": u.signal,
                "stopped_by_launcher": u.stopped_by_launcher,
                "role": self.roles.get(id(u), "unknown"),
                "category": None if best is None or best.category == "cascade" else best.category,
                "log": u.log,
            })  # fmt: skip
        return out

    def to_json(self) -> dict[str, Any]:
        return {"root_cause": self.root_json(), "ranks": self.ranks_json(), "source": self.source}


def _who(u: Unit | None) -> str:
    if u is None:
        return "the job"
    if u.rank is None:
        return u.label or (f"node {u.node}" if u.node is not None else "the process")
    return f"rank {u.rank}" + (f" (node {u.node})" if u.node is not None else "")


def _victim(u: Unit, others_failed: bool) -> bool:
    """Stopped because another rank failed: the launcher's teardown, or a SIGTERM."""
    if u.stopped_by_launcher:
        return True
    sig = catalog.signal_of(u.exit_code, u.signal)
    if sig in catalog.STOP_SIGNALS and others_failed:
        return True
    best = u.finding.best if u.finding else None
    return not u.failed and best is not None and best.strength == CASCADE


def _ts(u: Unit) -> float:
    best = u.finding.best if u.finding else None
    return best.line.ts if best and best.line.ts else NO_TS


def _exit_abort_summary(u: Unit, how: str) -> str:
    """Why the abort is called one at exit (classify.exit_abort: how sure, and why)."""
    sure = ("and an empty Python stack at the abort (faulthandler)" if how == "certain"
            else "and no Python error before it")  # fmt: skip
    return (f"{_who(u)} aborted (SIGABRT) in its process's shutdown, after its program had "
            f"finished: `terminate called without an active exception` as its last words, "
            f"{sure}")  # fmt: skip


def _last_lines(u: Unit, n: int = 3) -> list[str]:
    return u.last_lines[-n:]


def _finish(d: Diagnosis, case: Case, root: Unit | None) -> None:
    failed_any = any(u.failed for u in case.units)
    for u in case.units:
        if u is root or u.rank in d.missing:
            role = "root_cause" if u is root or len(d.missing) == 1 else "missing"
        elif _victim(u, failed_any):
            role = "stopped"
        elif u.failed or (u.finding and u.finding.strength >= TIMEOUT and u.exit_code is None):
            role = "failed"
        elif u.exit_code == 0:
            role = "ok"
        elif case.run is not None and u.exit_code is None:
            role = "running" if (case.run.get("state") in ("RUNNING", "RETRYING")) else "unknown"
        else:
            role = "unknown"
        d.roles[id(u)] = role
    d.units = case.units
    d.source = case.source
    if root is not None and root.error is not None and d.error is None:
        d.error = root.error
        if d.category == "unknown":  # the log did not say why; the rank's error file does
            d.summary = f"{_who(root)} raised {d.error.message}"
    d.notes += case.notes
    d.run = case.run


def _node_diag(first: Unit, case: Case) -> Diagnosis:
    """A node's loss or failed health checks: its message, as the controller recorded it
    (`node_lost: node-1 (no heartbeat for 5s, last seen ...)`), is the cause."""
    label = first.label
    why = str(((case.run or {}).get("first_failure") or {}).get("message") or "")
    why = why.removeprefix(f"{label}: ")
    if label == "node_unhealthy":
        summary = (why or "a node failed its health checks") + " (no rank started there)"
    else:
        summary = why or f"node {first.node}: its agent was lost"
    return Diagnosis(label, summary, None, first.node, [], log=first.log)


def _hit_diag(u: Unit | None, hit: Hit) -> Diagnosis:
    category = hit.category if hit.category != "cascade" else "unknown"
    summary = hit.summary
    if hit.frame and category in ("python_exception", "missing_module", "gpu_oom",
                                  "launch_env_missing"):  # fmt: skip
        summary += f" (at {hit.frame})"
    rank = u.rank if u else None
    node = u.node if u else None
    if category in ("port_in_use", "network_unreachable"):
        if u is not None and (u.rank is not None or u.node is not None):
            summary = f"{_who(u)}: {summary}"
        if category == "network_unreachable" and LOOPBACK.search(hit.summary):
            why = "ranks connect to a loopback address across hosts (a rank advertised "
            summary = why + "127.0.0.1: wrong interface or a hostname resolving to it); " + summary
        rank = None  # a port held by someone else or a wrong interface: no rank is the cause
    return Diagnosis(category, summary, rank, node, list(hit.evidence), hit.frame,
                     u.log if u else None)  # fmt: skip


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _time_limit_diag(run: dict[str, Any]) -> Diagnosis:
    """The time limit, and how long before it the ranks had gone silent: a run that wrote
    nothing for most of its attempt (or for HUNG_SILENCE_S) was likely hung, not slow."""
    from trebuchet.spec.duration import human

    attempt = int(run.get("attempt") or 0) + 1  # shown from 1, as `treb status` lists them
    limit = run.get("timeout")
    text = f"attempt {attempt} reached its time limit"
    if limit:
        text += f" of {limit:g} s (timeout:)"
    evidence = [text]
    end, start, last = run.get("attempt_ended_at"), run.get("attempt_started_at"), run.get(
        "last_output")  # fmt: skip
    if not (end and last):
        return Diagnosis("time_limit", text + "; every rank was stopped", evidence=evidence)
    at, whose, line = last
    silent = max(0.0, end - at)
    ran = end - start if start else None
    said = f": {line}" if line else " (no output at all)"
    evidence.append(f"last output: {whose} at {_clock(at)}, {human(silent)} before the end{said}")
    if ran is None or silent < min(HUNG_SILENCE_S, HUNG_SHARE * ran) or silent < 1.0:
        return Diagnosis("time_limit", text + "; every rank was stopped", evidence=evidence)
    summary = (f"{text}; no rank had written anything for the last {human(silent)} of its "
               f"{human(ran)} (since {_clock(at)}): likely hung")  # fmt: skip
    return Diagnosis("time_limit", summary, evidence=evidence, fix=catalog.TIME_LIMIT_SILENT)


def _engine_diag(run: dict[str, Any]) -> Diagnosis | None:
    """What the run's engine says of a run that ended with no process's failure record
    (Backend.explain_ending: a submission it refused, a job it lost); None: it says nothing,
    or it is not installed here."""
    from trebuchet.backends import get_backend
    from trebuchet.errors import UserError

    if not run.get("backend"):
        return None
    try:
        said = get_backend(str(run["backend"])).explain_ending(run)
    except UserError:
        return None
    if not said:
        return None
    category = said["category"]
    fix = said.get("fix")
    if fix is None and said.get("resources"):  # what the scheduler has, for how to look
        fix = catalog.REMEDIES.get(category, "").replace(catalog.SINFO_HINT, said["resources"])
    return Diagnosis(category, said["summary"], evidence=list(said.get("evidence") or []),
                     fix=fix)  # fmt: skip


def _lost_diag(run: dict[str, Any]) -> Diagnosis:
    """No outcome was recorded and the engine says nothing more: the supervisor vanished."""
    host = run.get("host") or "its host"
    text = (f"the run's supervisor (pid {run.get('supervisor_pid') or '?'} on {host}) "
            "vanished without recording an outcome")  # fmt: skip
    return Diagnosis("node_failure", text + ": the host went down or the launcher was "
                     "killed", evidence=[text])  # fmt: skip


def _state_diag(case: Case) -> Diagnosis | None:
    run = case.run or {}
    state = run.get("state")
    when = run.get("ended_at")
    at = f" at {_clock(when)}" if when else ""
    attempt = int(run.get("attempt") or 0) + 1  # shown from 1, as `treb status` lists them
    if state == "CANCELLED" and str(run.get("reason") or "").startswith("dependency "):
        why = str(run["reason"])  # --after: a run it waited for did not end as asked
        return Diagnosis("cancelled", f"cancelled{at} before it started: {why}", evidence=[why],
                         fix="Nothing of this run failed: see why its dependency ended so "
                         "(`treb status`); resubmit it with --after RUN:any to start it "
                         "whatever that run's end")  # fmt: skip
    if state == "CANCELLED" and run.get("first_failure"):
        return None  # cancelled after an attempt failed: that failure is diagnosed (decide)
    if state == "CANCELLED":
        why = f"attempt {attempt}: {run.get('reason') or 'cancel'}"
        return Diagnosis("cancelled", f"the run was cancelled{at} (treb cancel, Ctrl+C or a "
                         "signal to the launcher); nothing failed", evidence=[why])  # fmt: skip
    if state == "TIMEOUT":
        return _time_limit_diag(run)
    ff = run.get("first_failure") or {}
    if ff.get("label") == "disk":  # the supervisor stopped the run: it could not write
        text = str(ff.get("message") or "no space left on device")
        return Diagnosis("disk_full", f"the run was stopped{at}: {text}", evidence=[text])
    if state in ("LOST", "FAILED") and not run.get("first_failure"):
        said = _engine_diag(run)
        if said or state == "FAILED":
            return said
        return _lost_diag(run)
    return None


def _env_diag(u: Unit) -> Diagnosis:
    """The environment build failed before any rank started: the package the installer
    could not find when its log says so, else the build's own message."""
    finding = u.finding
    hits = [h for h in (finding.hits if finding else []) if h.category == "environment_build"]
    evidence = _build_command(u)
    for h in hits:
        m = catalog.PACKAGE_MISSING.search(h.line.text)
        if m:
            pkg = next(g for g in m.groups() if g)
            evidence.append(h.line.raw)
            summary = f"the environment build failed: {pkg} was not found in the package index"
            return Diagnosis("environment_build", summary + " (nothing ran)", None, None,
                             evidence, log=u.log)  # fmt: skip
    errors = [ln.raw for ln in (finding.errors if finding else [])]
    evidence += errors[-4:] or u.last_lines[-3:]
    message = u.lines[-1].text.removeprefix("treb: ") if u.lines else "environment build failed"
    return Diagnosis("environment_build", message, None, None, evidence, log=u.log)


def _build_command(u: Unit) -> list[str]:
    """The build's last command (treb writes each as a `$ ` line): from the log's last
    lines, else from its last MiB (the installer's hints and warnings after its error)."""
    said = [ln for ln in u.last_lines if ln.startswith("$ ")][-1:]
    if said or not u.log:
        return said
    try:
        with open_regular(u.log) as fh:
            fh.seek(max(0, fh.seek(0, 2) - (1 << 20)))
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    return [visible(ln) for ln in text.split("\n") if ln.startswith("$ ")][-1:]


def _setup_diag(u: Unit, message: str) -> Diagnosis:
    """A node's setup failed before any rank started: the line and its last output (the
    engine's message), the error-looking lines of setup's log (else its last) as evidence."""
    evidence = [ln.raw for ln in (u.finding.errors if u.finding else [])][-4:]
    summary = (message or "the node's setup failed") + " (no rank started)"
    return Diagnosis("setup_failed", summary, None, u.node, evidence or _last_lines(u, 4),
                     log=u.log)  # fmt: skip


def _hang_diag(case: Case) -> Diagnosis | None:
    """An attempt stopped for a hang (diagnose/hang.py): where each rank was stuck."""
    from trebuchet.diagnose.hang import for_run

    found = for_run(case.run or {})
    return Diagnosis("hang", **found) if found else None


def _idle_gpu_diag(case: Case) -> Diagnosis | None:
    """An attempt the job controller stopped for idle GPUs (runtime/watch/gpu.py's idle_gpu
    event, action fail): what the rule saw."""
    run = case.run or {}
    if not run.get("run_dir") or run.get("state") in ("SUCCEEDED", "RUNNING", "PENDING"):
        return None
    from trebuchet.store.files import read_events

    attempt = int(run.get("attempt") or 0)
    found = [e for e in read_events(Path(run["run_dir"])) if e.get("event") == "idle_gpu"
             and e.get("action") == "fail" and e.get("attempt") == attempt]  # fmt: skip
    if not found:
        return None
    e = found[-1]
    summary = (f"no GPU was busy for {float(e.get('idle_s') or 0):.0f}s: the run's "
               f"{e.get('gpus')} GPU(s) on {e.get('nodes')} node(s) sat idle "
               "(idle_gpu_action: fail)")  # fmt: skip
    return Diagnosis("idle_gpu", summary, None, None, [])


def _timeout_diag(case: Case, timed: list[tuple[Unit | None, Hit]]) -> Diagnosis:
    """A collective timeout: name the rank(s) that were not there, when the logs tell."""
    timed_ranks = {u.rank for u, _ in timed if u is not None and u.rank is not None}
    explicit: set[int] = set()
    for _, h in timed:
        explicit.update(h.missing)
    missing = explicit - timed_ranks  # a rank that itself timed out was there, waiting
    how = "named by the timeout message"
    if not missing:  # NCCL: a rank that never enqueued the collective the others wait in
        seqs = [u.finding.timeout_seq for u in case.units if u.finding and u.finding.timeout_seq]
        if seqs:
            top = max(seqs)
            missing = {u.rank for u in case.units if u.rank is not None and u.finding
                       and u.finding.last_enqueued is not None and u.finding.last_enqueued < top
                       and u.finding.timeout_seq is None}  # fmt: skip
            how = "it never enqueued the collective the others timed out in"
    if not missing:  # the rank whose log stayed silent while the others timed out
        top = max((u.finding.timeout_seq or 0 for u in case.units if u.finding), default=0)
        silent = {u.rank for u in case.units if u.rank is not None and u.rank not in timed_ranks
                  and (not u.finding or u.finding.strength < TIMEOUT)
                  and not (u.failed and not _victim(u, True))
                  and not (u.finding and top and (u.finding.last_enqueued or 0) >= top)
                  }  # fmt: skip
        if silent and len(silent) <= len(timed_ranks):
            missing = silent
            how = "its log shows no timeout while the others timed out waiting"
    first_u, first_h = min(timed, key=lambda t: (t[1].line.ts or NO_TS, t[0].order if t[0] and
                           t[0].order is not None else 1 << 30, t[1].line.pos))  # fmt: skip
    waiting = sorted(timed_ranks)
    wait_txt = ", ".join(map(str, waiting[:8])) + (" ..." if len(waiting) > 8 else "")
    evidence = []

    def by_rank(t: tuple[Unit | None, Hit]) -> int:
        return t[0].rank if t[0] is not None and t[0].rank is not None else -1

    for _u, h in sorted(timed, key=by_rank)[:3]:
        evidence += h.evidence[-1:]
    if len(missing) == 1:
        (m,) = missing
        mu = next((u for u in case.units if u.rank == m), None)
        waiters = f"{'rank' if len(waiting) == 1 else 'ranks'} {wait_txt}" if waiting else (
            "the ranks waiting for it")  # fmt: skip
        summary = (f"rank {m} never joined the collective ({how}); {waiters} timed out "
                   f"waiting: {first_h.summary}")  # fmt: skip
        if mu and mu.last_lines:
            evidence += [f"rank {m}, last line: {mu.last_lines[-1]}"]
        return Diagnosis("collective_timeout", summary, m, mu.node if mu else None, evidence,
                         log=mu.log if mu else None, missing=missing)  # fmt: skip
    if missing:
        names = ", ".join(map(str, sorted(missing)[:8]))
        summary = f"ranks {names} never joined the collective ({how}): {first_h.summary}"
    else:
        who = f"{'rank' if len(waiting) == 1 else 'ranks'} {wait_txt}" if waiting else "ranks"
        summary = (f"{who} timed out in a collective; the logs do not show which rank never "
                   f"joined: {first_h.summary}")  # fmt: skip
    return Diagnosis("collective_timeout", summary, None, None, evidence,
                     log=first_u.log if first_u else None, missing=missing)  # fmt: skip


def _logs_hint(d: Diagnosis, case: Case) -> str:
    """Where the root cause's whole output is: `treb logs` of this run and rank, or the
    file to read for logs from elsewhere."""
    run = case.run or {}
    root = next((u for u in case.units if d.roles.get(id(u)) == "root_cause"), None)
    rank = d.rank if d.rank is not None else (root.rank if root else None)
    if case.in_store and run.get("id") and not (root and root.label == "environment"):
        cmd = f"treb logs {run['id']}"
        if rank is not None:
            cmd += f" --rank {rank}"
        elif root is not None and root.node is not None and str(root.node).isdigit():
            cmd += f" --node {root.node}"
        if run.get("attempt", 0) != run.get("latest_attempt", run.get("attempt", 0)):
            cmd += f" --attempt {run['attempt'] + 1}"  # from 1, as treb logs counts
        return f"`{cmd}` has its whole output"
    log = d.log or (root.log if root else None)
    if not log:
        return "the logs read have its whole output"
    shared = sum(1 for u in case.units if u.log == log) > 1
    if shared and rank is not None:
        return f"{log} has its whole output, in the lines of rank {rank}"
    return f"{log} has its whole output"


def fit_remedy(d: Diagnosis, case: Case) -> None:
    """The catalog's remedy, told for this run: where its logs are, and no CUDA advice for
    a crash on a run without GPUs."""
    if d.category is None:
        return
    fix = d.remedy
    if d.category == "segfault" and (case.run or {}).get("gpus") == 0:
        fix = catalog.SEGFAULT_CPU
    if catalog.LOGS_HINT in fix:
        fix = fix.replace(catalog.LOGS_HINT, _logs_hint(d, case))
    d.fix = fix


def decide(case: Case) -> Diagnosis:
    d, root = _decide(case)
    _finish(d, case, root)
    run = case.run or {}
    if run.get("state") == "CANCELLED" and run.get("first_failure") and d.category:
        n = int(run["first_failure"].get("attempt") or 0) + 1  # from 1, as `treb status`
        d.summary = (f"the run was cancelled after attempt {n} failed, before its retry "
                     f"ran; attempt {n}: {d.summary}")  # fmt: skip
    if d.category == "missing_file" and case.run and case.run.get("run_dir"):
        from trebuchet.launcher.snapshot import why_missing

        why = why_missing(Path(case.run["run_dir"]), [d.summary, *d.evidence])
        if why:
            d.summary += f"; {why}"
    fit_remedy(d, case)
    if d.category == "network_unreachable":  # what the logs say about interfaces
        hints = [ln.raw for u in case.units for ln in u.lines if "IFNAME" in ln.text]
        hints += [ln.raw for ln in case.unattributed if "IFNAME" in ln.text]
        d.evidence += [h for h in dict.fromkeys(hints) if h not in d.evidence][:2]
    if d.category == "scheduler_refusal":  # srun says why in one line, what it refused in another
        lines = [h.line.raw for u in case.units if u.finding for h in u.finding.hits
                 if h.category == "scheduler_refusal"]  # fmt: skip
        d.evidence += [ln for ln in dict.fromkeys(lines) if ln not in d.evidence][:3]
    return d


def _stopped_by_slurm(case: Case) -> Diagnosis | None:
    """A job log where srun aborted the step and every task died of a stop signal: Slurm
    ended the job (its time limit, scancel, a preemption, a lost node, Ctrl+C on srun), and
    slurmstepd's line saying which never reached the log (srun can end before it is
    forwarded: seen in CI, 2 tasks SIGTERMed at their time limit, no line). A task with no
    exit line of its own is not read: srun prints no exit 0, and with
    SLURM_SRUN_REDUCE_TASK_EXIT_MSG set none that repeats the previous task's status
    (srun/launch.c, _task_finish): it ended as a line before it says, or well."""
    aborted = case.aborted
    signals = {
        "stopped" if u.stopped_by_launcher else catalog.signal_of(u.exit_code, u.signal)
        for u in case.units
        if u.failed or u.stopped_by_launcher
    }  # stopped_by_launcher: srun killed it after its abort
    if aborted is None or not signals or not signals <= catalog.STOP_SIGNALS | {"stopped"}:
        return None
    if any(STEP_FAILED.search(ln.text) for ln in case.unattributed):
        return None
    said = next((m for ln in case.unattributed if (m := SRUN_JOB.search(ln.text))), None)
    named = SLURM_OUT_NAME.search(Path(case.source).name)  # sbatch's default: slurm-%j.out
    job = (said["job"] or said["step"]) if said else named["job"] if named else "JOBID"
    summary = (f"Slurm stopped every task and none failed on its own; this log does not say "
               f"why (`sacct -j {job} -o JobID,State,Reason,Elapsed,Timelimit` does)")  # fmt: skip
    stops = [ln.raw for ln in case.unattributed if srun_stop(ln.text)]
    stops += [ln.raw for u in case.units for ln in u.lines if TORCHRUN_STOPPED.search(ln.text)]
    evidence = [aborted.raw, *stops[:2]]
    fix = catalog.REMEDIES["stopped_by_slurm"].replace("JOBID", job)
    return Diagnosis("stopped_by_slurm", summary, evidence=evidence, fix=fix)


def _decide(case: Case) -> tuple[Diagnosis, Unit | None]:
    """The diagnosis, and the unit it blames (None: no unit)."""
    u: Unit | None  # each unit in turn; at the end, the one the diagnosis blames (or none)
    for u in case.units:
        if u.finding is None:
            u.finding = classify(u.lines, case.multi_host)
    loose: Finding = classify(case.unattributed, case.multi_host)
    run = case.run or {}
    state = run.get("state")
    any_failed = any(u.failed for u in case.units)

    if state == "SUCCEEDED" or (state in ("PENDING", "RUNNING", "RETRYING") and not any_failed):
        return Diagnosis(None, f"run {state.lower()}: nothing to diagnose" if state else ""), None
    said = _state_diag(case) or _hang_diag(case) or _idle_gpu_diag(case)
    if said:
        rank = said.rank
        return said, next((u for u in case.units if rank is not None and u.rank == rank), None)

    # The scheduler's verdict on the whole job, unless a task had failed before it.
    for ev in sorted(case.events, key=lambda e: e.pos):
        if case.failure_pos is not None and case.failure_pos < ev.pos:
            continue  # e.g. the step cancelled because a task failed: the cascade
        text = ev.line
        summary = ev.summary or text.split("error: ", 1)[-1].strip(" *")
        return Diagnosis(ev.category, summary, None, ev.node, [text]), None

    victims = {id(u) for u in case.units if _victim(u, any_failed)}
    first: Unit | None = None
    if case.first_failure is not None:
        first = case.units[case.first_failure]
    else:
        ordered = [u for u in case.units
                   if u.failed and id(u) not in victims and u.order is not None]  # fmt: skip
        if ordered:
            first = min(ordered, key=lambda u: u.order or 0)
    fbest = first.finding.best if first and first.finding else None
    if first is not None and first.label == "environment":
        return _env_diag(first), first
    if first is not None and first.label in ("node_unhealthy", "node_lost"):
        return _node_diag(first, case), first  # runtime/node/health.py, runtime/job/nodeloss.py
    if first is not None and first.label == "setup":
        message = str(((case.run or {}).get("first_failure") or {}).get("message") or "")
        return _setup_diag(first, message), first

    # 2. the first failure explains itself
    if first and fbest and fbest.strength == CAUSE:
        return _hit_diag(first, fbest), first
    if first and loose.best and loose.best.strength == CAUSE and fbest is None:
        return _hit_diag(first, loose.best), first  # an srun log without labels: one traceback
    # 3. a death by signal
    if first:
        sig = catalog.signal_of(first.exit_code, first.signal)
        cat = catalog.SIGNAL_CATEGORY.get(sig or "")
        if cat and (fbest is None or fbest.strength < TIMEOUT or fbest.category == cat):
            how = f"was killed by {sig}" if sig else f"exited with code {first.exit_code}"
            note = ""
            if cat == "killed":
                note = " with no launcher kill (the kernel OOM killer, or kill -9)"
            summary = f"{_who(first)} {how}{note}"
            at_exit = exit_abort(first.lines, first.last_lines) if cat == "aborted" else None
            if at_exit is not None:
                cat, summary = "exit_abort", _exit_abort_summary(first, at_exit)
            evidence = [f"{_who(first)}: {catalog.exit_meaning(first.exit_code, sig)}"]
            evidence += [h.line.raw for h in (first.finding.hits if first.finding else [])][:2]
            evidence += [f"last line: {ln}" for ln in _last_lines(first, 2)]
            return Diagnosis(cat, summary, first.rank, first.node, evidence, log=first.log), first
    # 4. the earliest cause in any rank's log
    causes = [u for u in case.units if u.finding and u.finding.best
              and u.finding.best.strength == CAUSE
              and u.finding.best.category != "cascade"]  # fmt: skip
    if causes:
        u = min(causes, key=lambda x: (id(x) in victims, _ts(x), x.order if x.order is not None
                                       else 1 << 30, x.ended_at or NO_TS, x.rank or 0))  # fmt: skip
        best = u.finding.best if u.finding else None
        assert best is not None  # causes: units whose best hit is a CAUSE
        return _hit_diag(u, best), u
    if loose.best and loose.best.strength == CAUSE:
        return _hit_diag(first, loose.best), first
    # 5. a collective timeout
    timed: list[tuple[Unit | None, Hit]] = []
    for u in case.units:
        for h in u.finding.hits if u.finding else []:
            if h.category == "collective_timeout":
                timed.append((u, h))
                break
    timed += [(first, h) for h in loose.hits if h.category == "collective_timeout"][:1]
    if timed:
        d = _timeout_diag(case, timed)
        return d, next((u for u in case.units if d.rank is not None and u.rank == d.rank), None)
    # 6. the exit code, and the last error-looking lines
    u = first or next((x for x in case.units if x.failed and id(x) not in victims), None)
    if u is None and case.units and not any_failed:
        u = next((x for x in case.units if x.finding and x.finding.errors), None)
    if u is None and not case.run:
        stopped = _stopped_by_slurm(case)
        if stopped:
            return stopped, None
    if u is None:
        errors = [ln.raw for ln in loose.errors[-5:]]
        if not errors and not case.run:  # logs that show no failure at all
            return Diagnosis(None, f"no failure found in {case.source}"), None
        return Diagnosis("unknown", "no failure found in what was read", evidence=errors), None
    if u.exit_code in (126, 127):
        text = f"{_who(u)}: {catalog.exit_meaning(u.exit_code)}"
        return Diagnosis("bad_command", text, u.rank, u.node, [text] + _last_lines(u),
                         log=u.log), u  # fmt: skip
    errors = [ln.raw for ln in (u.finding.errors if u.finding else [])][-5:] or _last_lines(u, 5)
    how = catalog.exit_meaning(u.exit_code, u.signal) if u.failed else "errors in its log"
    ff = cast("Outcome", (case.run or {}).get("first_failure") or {})
    words = f"{_who(u)} failed first ({how})"
    if u is first and ff.get("left_first"):  # rundir/records.left_first
        words = f"{_who(u)} {left_first_how(ff)}, so its own exit code is lost"
    return Diagnosis("unknown", f"{words}; no known cause in its log", u.rank, u.node, errors,
                     log=u.log), u  # fmt: skip
