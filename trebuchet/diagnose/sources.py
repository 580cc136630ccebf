"""What diagnosis reads, turned into ranks (Units) with their outcomes and log lines.

- a trebuchet run (from the store, or its run directory given as a path): the outcome
  record of every process (exit code, signal, end time, stopped by the launcher or not);
  under torchrun, the agent's report in node-<n>.log and each rank's rank-<r>.log;
- a torchrun console log: the "Root Cause (first observed failure)" report and its
  error files, `[default0]:` / `[rank3]:` prefixes;
- an srun job log: "srun: error: tn2: task 3: Exited with exit code 1", `3: ` labels,
  slurmstepd's "CANCELLED AT ... DUE TO TIME LIMIT" and node failures;
- a directory of per-rank logs (rank-3.log, worker_3.out, torchrun's attempt_0/3/*.log).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trebuchet import registry
from trebuchet.diagnose import errorfile
from trebuchet.diagnose import scan as scanner
from trebuchet.diagnose.catalog import (
    CANCEL_WHY,
    OOM_KILLED,
    SIGNAL_NAMES,
    SLURM_CANCELLED,
    STOP_SIGNALS,
)
from trebuchet.diagnose.classify import Finding
from trebuchet.diagnose.errorfile import RankError
from trebuchet.diagnose.lines import LogLine, parse
from trebuchet.runtime.rundir.records import read_json
from trebuchet.runtime.rundir.regular import read_text

NODE_CAUSES = ("node_lost", "node_unhealthy")  # a node's, not a process's: no rank's log

# srun's word for a task's end (srun/launch.c, _task_finish: strsignal() of its signal, or
# Out Of Memory): (its exit code as a shell's, its signal)
SRUN_WHAT = {
    "Killed": (137, "SIGKILL"), "Terminated": (143, "SIGTERM"),
    "Segmentation fault": (139, "SIGSEGV"), "Aborted": (134, "SIGABRT"),
    "Illegal instruction": (132, "SIGILL"), "Bus error": (135, "SIGBUS"),
    "Floating point exception": (136, "SIGFPE"), "Out Of Memory": (137, "SIGKILL"),
    "Interrupt": (130, "SIGINT"), "Hangup": (129, "SIGHUP"), "Quit": (131, "SIGQUIT"),
    "Trace/breakpoint trap": (133, "SIGTRAP"), "User defined signal 1": (138, "SIGUSR1"),
    "User defined signal 2": (140, "SIGUSR2"), "Broken pipe": (141, "SIGPIPE"),
    "Alarm clock": (142, "SIGALRM"), "Stack fault": (144, "SIGSTKFLT"),
    "CPU time limit exceeded": (152, "SIGXCPU"), "File size limit exceeded": (153, "SIGXFSZ"),
    "Virtual timer expired": (154, "SIGVTALRM"), "Profiling timer expired": (155, "SIGPROF"),
    "I/O possible": (157, "SIGIO"), "Power failure": (158, "SIGPWR"),
    "Bad system call": (159, "SIGSYS"),
}  # fmt: skip
# srun: "srun: error: tn2: task 3: Exited with exit code 1", "srun: error: tn1: tasks 0-1: Killed"
SRUN_TASK = re.compile(
    r"^(?:(?:srun|salloc): error: )?(?:(?P<node>[\w.-]+): )?tasks? (?P<tasks>\d+(?:[-,]\d+)*): "
    r"(?P<what>Exited with exit code (?P<code>\d+)|" + "|".join(map(re.escape, SRUN_WHAT)) + ")"
)


def srun_stop(text: str) -> bool:
    """srun's line of tasks ended by a stop: a stop signal, or `Killed` (srun's SIGKILL
    after its abort, where no OOM killer struck)."""
    m = SRUN_TASK.match(text)
    if m is None or m["code"]:
        return False
    return m["what"] == "Killed" or SRUN_WHAT[m["what"]][1] in STOP_SIGNALS


MPI_NOTICED = re.compile(
    r"process rank (?P<rank>\d+) with PID \d+ on node (?P<node>\S+) exited on signal (?P<sig>\d+)"
)
SLURM_EVENT = re.compile(r"(?:slurmstepd(?:-(?P<host>[\w.-]+))?: error: )?" + SLURM_CANCELLED)
# What srun and salloc say when the job is stopped from outside (Slurm's srun/signals.c,
# salloc/salloc.c): the user's Ctrl+C on srun, and the allocation's end.
SRUN_CTRL_C = re.compile(r"^srun: sending Ctrl-C to (?:job )?(?P<step>\S+)")  # job: before 20.11
SALLOC_REVOKED = re.compile(
    r"^salloc: Job (?:\d+ has exceeded its (?P<limit>time limit) and its allocation|allocation \d+)"
    r" has been revoked"
)
OOM_KILL = re.compile(OOM_KILLED)
STEP_ABORTED = re.compile(r"^srun: Job step aborted\b")  # srun, told its job is over
# srun's words that a step is over (api/step_launch.c: its tasks are gone, or it gave up) or
# that another one begins (api/allocate.c, srun/launch.c)
STEP_OVER = re.compile(
    r"^srun: (?:Force Terminated \S|error: Timed out waiting for job step to complete"
    r"|job \d+ (?:queued and waiting for|has been allocated) resources|Step created for \S)"
)
# torchrun (torch's elastic agent) told to stop: it stops its workers and exits 1
TORCHRUN_STOPPED = re.compile(r"SignalException: Process \d+ got signal: (?:1|2|15)$")
NODE_FAIL = re.compile(r"Node failure on (?P<node>[\w.-]+)")
SRUN_MARK = re.compile(r"^(?:srun|salloc|slurmstepd)[:-]|^\s*\d+: ", re.M)
ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
RANK_IN_NAME = (
    re.compile(r"(?:rank|task|proc|process|worker)[-_.]?(\d+)", re.I),
    re.compile(r"(?:^|/)(\d+)/(?:stdout|stderr)\.log$"),
    re.compile(r"[-_.](\d+)\.(?:log|out|err|txt)$"),
)
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
# sbatch's default output file, slurm-%j.out (an array task's: slurm-%A_%a.out; its stderr
# apart: slurm-%j.err): one job's log, its number the job's id (Slurm's are 32-bit, in ASCII
# digits, from 1), not a rank's
SLURM_OUT_NAME = re.compile(r"^slurm-(?P<job>[0-9]{1,10}(?:_[0-9]{1,10})?)\.(?:out|err)\Z")
# srun's and salloc's own lines: only the job's log holds them (a task's own output, srun -o
# rank-%t.log, has none), whatever its name (sbatch -o %x-%j.out)
JOB_LOG_LINE = re.compile(r"^(?:srun|salloc): ")


@dataclass
class Unit:
    """One rank (or one process of the job) as the sources show it."""

    rank: int | None
    node: str | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    ended_at: float | None = None
    stopped_by_launcher: bool | None = None
    log: str | None = None
    lines: list[LogLine] = field(default_factory=list)
    last_lines: list[str] = field(default_factory=list)
    order: int | None = None  # when a launcher observed its failure (0 first)
    label: str | None = None
    finding: Finding | None = None
    error: RankError | None = None  # its @record error file (errorfile.py)

    @property
    def failed(self) -> bool:
        return bool(self.signal) or (self.exit_code is not None and self.exit_code != 0)


@dataclass
class JobEvent:
    """A scheduler's verdict on the whole job: time limit, node failure, cancel."""

    category: str
    line: str
    pos: int
    node: str | None = None
    summary: str | None = None  # treb's words for it, where the line is no sentence


@dataclass
class Case:
    """Everything read, ready for the engine."""

    source: str
    units: list[Unit] = field(default_factory=list)
    unattributed: list[LogLine] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    multi_host: bool | None = None
    run: dict[str, Any] | None = None  # a trebuchet run: id, name, state, attempt, ...
    first_failure: int | None = None  # index into units of the launcher's first failure
    failure_pos: int | None = None  # position of the first task failure line (merged logs)
    notes: list[str] = field(default_factory=list)
    aborted: LogLine | None = None  # srun's `Job step aborted` (it then SIGKILLs the step)
    in_store: bool = False  # a run the store knows: `treb logs RUN` reads its logs


# -- helpers -------------------------------------------------------------------------------
MAX_TASKS = 1 << 17  # of one srun line: a log's `tasks 0-4294967295` is not built whole


def _expand(tasks: str) -> list[int]:
    out: list[int] = []
    for part in tasks.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            first = int(a)
            out += range(first, min(int(b), first + MAX_TASKS - len(out) - 1) + 1)
        elif part:
            out.append(int(part))
        if len(out) >= MAX_TASKS:
            break
    return out[:MAX_TASKS]


def _sig(exit_code: int | None) -> str | None:
    if exit_code is None or exit_code >= 0:
        return None
    return SIGNAL_NAMES.get(-exit_code, f"SIG{-exit_code}")


def rank_from_name(rel: str) -> int | None:
    """The rank a per-rank log's name holds; None for other names (job_logs says which
    names are a job's)."""
    for rx in RANK_IN_NAME:
        m = rx.search(rel)
        if m:
            return int(m.group(1))
    return None


def job_logs(files: list[Path]) -> set[Path]:
    """The files named as a Slurm job's log (slurm-JOBID.out, .err); none where one is
    slurm-0.*: Slurm has no job 0, so they are a job's per-task logs (srun -o slurm-%t.out).
    The logs of several jobs read as one are refused: their tasks would be taken for one
    job's ranks, and one diagnosis of two jobs is neither's."""
    named = {p: m["job"] for p in files if (m := SLURM_OUT_NAME.match(p.name))}
    if any(int(job.split("_")[0]) == 0 for job in named.values()):
        return set()
    jobs = sorted(set(named.values()))
    if len(jobs) > 1:
        from trebuchet.errors import UserError

        logs = [p for p in files if p in named]
        raise UserError(
            f"{', '.join(map(str, logs))} are the logs of {len(jobs)} Slurm jobs (sbatch's "
            f"slurm-JOBID.out), not of one job's ranks: diagnose each on its own "
            f"(treb diagnose {logs[0]})"
        )
    return set(named)


def _scan_lines(path: Path, srun_labels: bool | None = None) -> tuple[list[LogLine], list[str]]:
    sc = scanner.scan(path)
    if srun_labels is None:
        srun_labels = any(SRUN_MARK.search(ln) for ln in sc.lines[:200])
    return [parse(t, i, srun_labels) for i, t in enumerate(sc.lines)], sc.last_lines


def _outcome_unit(o: dict[str, Any], log: Path, **known: Any) -> Unit:
    """A process as its outcome record (rank-N.json, node-N.json) tells it."""
    return Unit(exit_code=o.get("exit_code"), signal=o.get("signal"), ended_at=o.get("ended_at"),
                stopped_by_launcher=bool(o.get("stopped_by_launcher")), log=str(log),
                **known)  # fmt: skip


def _unit(units: dict[int, Unit], rank: int) -> Unit:
    if rank not in units:
        units[rank] = Unit(rank=rank)
    return units[rank]


# -- torchrun's failure report --------------------------------------------------------------
def torchrun_report(lines: list[LogLine]) -> list[dict[str, Any]]:
    """Entries of torchrun's "Failures:" and "Root Cause" blocks, root cause first."""
    entries: list[dict[str, Any]] = []
    section = None
    cur: dict[str, Any] | None = None
    for ln in lines:
        t = ln.text
        if "Root Cause (first observed failure)" in t:
            section, cur = "root", None
            continue
        if t.strip().startswith("Failures:"):
            section, cur = "other", None
            continue
        if section is None:
            continue
        if t.startswith(("-----", "=====")):
            cur = None
            if t.startswith("====="):
                section = None
            continue
        m = ENTRY.match(t)
        if m:
            cur = {"root": section == "root", "traceback": []}
            entries.append(cur)
            continue
        if cur is None:
            continue
        m = FIELD.match(t)
        if m and not (cur.get("traceback") and m.group(1) != "traceback" and t.startswith("    ")):
            key, val = m.group(1), m.group(2).strip()
            if key == "rank":
                r = re.match(r"(\d+)(?: \(local_rank: (\d+)\))?", val)
                if r:
                    cur["rank"] = int(r.group(1))
                    cur["local_rank"] = int(r.group(2)) if r.group(2) else None
            elif key == "exitcode":
                r = re.match(r"(-?\d+)", val)
                cur["exitcode"] = int(r.group(1)) if r else None
            elif key == "traceback":
                cur["traceback"] = [val] if val else []
            else:
                cur[key] = val
            continue
        if cur.get("traceback") is not None and t.startswith("    "):
            cur["traceback"].append(t[4:] if t.startswith("    ") else t)
        elif cur.get("traceback") is not None and t.startswith("  ") and t.strip():
            cur["traceback"].append(t[2:])
    entries.sort(key=lambda e: not e["root"])
    return entries


def error_file_lines(path: str) -> list[LogLine]:
    """The exception a torchrun worker wrote with @record: its message and call stack."""
    data = read_json(path)
    if not isinstance(data, dict):
        return []
    msg = data.get("message", data)
    stack = ""
    text = ""
    if isinstance(msg, dict):
        text = str(msg.get("message", ""))
        stack = str((msg.get("extraInfo") or {}).get("py_callstack", ""))
    else:
        text = str(msg)
    raw = stack.splitlines() if stack.strip() else [text]
    return [parse(t, i) for i, t in enumerate(raw) if t is not None]


# -- merged logs: torchrun console, srun, mpirun, anything with prefixes ---------------------
@dataclass
class _Steps:
    """A job log's srun steps, one after another (a batch script's sruns): srun's abort and
    the SIGKILL it then sends (api/step_launch.c) are its own step's. That step is over when
    srun says so (STEP_OVER), or when a task srun already reported ended is reported again:
    a later step's. (Not when it writes again: srun may forward its last output after its
    exit.)"""

    aborted: bool = False  # inside an aborted step
    done: set[int] = field(default_factory=set)  # tasks reported since the abort
    stops: set[int] = field(default_factory=set)  # tasks whose last status is a stop

    def see(self, ln: LogLine) -> None:
        if STEP_ABORTED.search(ln.text):
            self.aborted, self.done = True, set()
        elif STEP_OVER.search(ln.text):
            self.aborted = False

    def aborted_now(self, tasks: list[int]) -> bool:
        """Whether srun's line of these tasks is the aborted step's."""
        if self.aborted and self.done.intersection(tasks):
            self.aborted = False
        return self.aborted

    def ended(self, task: int, stop: bool) -> None:
        if self.aborted:
            self.done.add(task)
        (self.stops.add if stop else self.stops.discard)(task)


def merged_log(path: Path, node_hint: str | None = None) -> Case:
    """One log holding many ranks' lines (a console log, a job's output file)."""
    lines, last = _scan_lines(path)
    case = Case(source=str(path))
    units: dict[int, Unit] = {}
    report = torchrun_report(lines)
    local_map: dict[int, int] = {}
    hosts: set[str] = set()
    for order, e in enumerate(report):
        if "rank" not in e:
            continue
        u = _unit(units, e["rank"])
        u.local_rank = e.get("local_rank")
        if u.local_rank is not None:
            local_map[u.local_rank] = e["rank"]
        u.node = e.get("host") or node_hint
        if e.get("host"):
            hosts.add(e["host"])
        code = e.get("exitcode")
        u.exit_code = code if code is None or code >= 0 else 128 - code
        u.signal = _sig(code)
        if u.order is None:
            u.order = order
        ef = e.get("error_file", "")
        extra: list[LogLine] = []
        if ef and not ef.startswith("<"):
            extra = error_file_lines(ef)
            u.log = ef
        if not extra and e.get("traceback") and e["traceback"][0].startswith("Traceback"):
            extra = [parse(t, i) for i, t in enumerate(e["traceback"])]
        for x in extra:
            x.pos = -1000 + x.pos  # the worker's own account comes first
            x.rank = e["rank"]
        u.lines += extra
    identity = all(k == v for k, v in local_map.items())
    job_pos = None
    killed_by_srun: dict[int, Unit] = {}
    steps = _Steps()
    for ln in lines:
        t = ln.text
        if case.aborted is None and STEP_ABORTED.search(t):
            case.aborted = ln  # from here srun sends the step SIGKILL (step_launch.c)
        steps.see(ln)
        m = SRUN_TASK.match(t)
        if m:
            code, sig = (int(m["code"]), None) if m["code"] else SRUN_WHAT[m["what"]]
            tasks = _expand(m["tasks"])
            # after its abort a Killed task of its step is srun's own kill (unless the OOM
            # killer's: below)
            by_srun = steps.aborted_now(tasks) and m["what"] == "Killed"
            for r in tasks:
                u = _unit(units, r)
                if m["node"]:
                    u.node = m["node"]
                    hosts.add(m["node"])
                if not u.failed or r in steps.stops:  # an earlier step's stop: replaced
                    u.order = ln.pos if r in steps.stops and (code or sig) else u.order
                    u.exit_code, u.signal = code, sig
                    steps.ended(r, stop=by_srun or sig in STOP_SIGNALS)
                    killed_by_srun.pop(r, None)
                    if by_srun:
                        killed_by_srun[r] = u
                if u.order is None and (code or sig):
                    u.order = ln.pos
            stopped = by_srun or sig in STOP_SIGNALS
            if (code or sig) and not stopped and job_pos is None:
                job_pos = ln.pos
            continue
        m = MPI_NOTICED.search(t)
        if m:
            u = _unit(units, int(m["rank"]))
            u.node = m["node"]
            u.signal = SIGNAL_NAMES.get(int(m["sig"]), f"SIG{m['sig']}")
            u.exit_code = 128 + int(m["sig"])
            u.order = ln.pos if u.order is None else u.order
        m = SLURM_EVENT.search(t)  # (not DUE TO TASK FAILURE: that task's, the cascade)
        if m:
            cat = CANCEL_WHY.get(m["why"] or "", "cancelled")
            case.events.append(JobEvent(cat, ln.raw, ln.pos, m["node"] or m["host"]))
        m = SALLOC_REVOKED.search(t)
        if m:
            cat = "time_limit" if m["limit"] else "cancelled"
            case.events.append(JobEvent(cat, ln.raw, ln.pos))
        m = SRUN_CTRL_C.search(t)
        if m:  # worded as treb words a run cancelled (engine._state_diag)
            said = f"the job step {m['step']} was cancelled (Ctrl+C on srun); nothing failed"
            case.events.append(JobEvent("cancelled", ln.raw, ln.pos, summary=said))
        m = NODE_FAIL.search(t)
        if m:
            case.events.append(JobEvent("node_failure", ln.raw, ln.pos, m["node"]))
            hosts.add(m["node"])
    case.failure_pos = job_pos
    if not any(OOM_KILL.search(ln.text) for ln in lines):  # else the OOM killer's SIGKILL
        for u in killed_by_srun.values():
            u.stopped_by_launcher = True
    for ln in lines:
        rank = ln.rank
        if rank is None and ln.local_rank is not None:
            rank = local_map.get(ln.local_rank, ln.local_rank if identity else None)
        if rank is None:
            case.unattributed.append(ln)
        else:
            _unit(units, rank).lines.append(ln)
    for u in units.values():
        u.lines.sort(key=lambda x: x.pos)
        if (
            case.aborted is not None
            and u.failed
            and u.signal is None
            and any(TORCHRUN_STOPPED.search(ln.text) for ln in u.lines)
        ):  # srun aborted the step and this task's torchrun was told to stop: no failure
            u.stopped_by_launcher = True
        if u.log is None:
            u.log = str(path)
        if u.node is None:
            u.node = node_hint
    case.units = sorted(units.values(), key=lambda u: u.rank if u.rank is not None else -1)
    if not case.units:
        case.notes.append(f"{path}: no rank prefixes; the log is read as one process")
        u = Unit(rank=None, node=node_hint, log=str(path), lines=case.unattributed,
                 last_lines=last)  # fmt: skip
        case.unattributed = []
        case.units = [u]
    case.multi_host = (len(hosts) > 1) if hosts else None
    return case


# -- directories of per-rank logs ----------------------------------------------------------
def _latest_attempt(root: Path) -> Path:
    attempts = sorted(
        (p for p in root.rglob("attempt_*") if p.is_dir()),
        key=lambda p: int(re.sub(r"\D", "", p.name) or 0),
    )
    return attempts[-1] if attempts else root


def log_dir(root: Path) -> Case:
    """A directory of per-rank logs: one Unit per rank (files of one rank are merged)."""
    base = _latest_attempt(root)
    files = sorted(p for p in base.rglob("*") if p.is_file() and (
        p.suffix in LOG_SUFFIXES or p.name == "error.json"))  # fmt: skip
    return _rank_logs(str(root), files, base)


def _rank_logs(source: str, files: list[Path], base: Path | None) -> Case:
    """Per-rank logs, one Unit per rank, and the job's or launcher's logs beside them
    (named as a job's, or holding srun's own lines) read for their task lines; `base`: the
    folder their names are read in (None: files given one by one, by their own names)."""
    jobs = job_logs(files)
    case = Case(source=source)
    units: dict[int, Unit] = {}
    loose: list[Path] = []
    for p in files:
        rel = str(p.relative_to(base)) if base else p.name
        rank = None if p in jobs else rank_from_name(rel)
        if p.name == "error.json":
            folder = p.parent.relative_to(base) if base else Path(p.parent.name)
            rank = rank_from_name(f"{folder}/stderr.log")
            if rank is not None:
                u = _unit(units, rank)
                u.lines = error_file_lines(str(p)) + u.lines
                u.exit_code = u.exit_code if u.exit_code is not None else 1
            continue
        if rank is None:
            loose.append(p)
            continue
        lines, last = _scan_lines(p)
        if any(JOB_LOG_LINE.match(ln.text) for ln in lines):  # a job's log, by another name
            loose.append(p)
            continue
        u = _unit(units, rank)
        u.lines += lines
        u.last_lines = last or u.last_lines
        u.log = str(p) if u.log is None or p.name == "stderr.log" else u.log
    case.units = sorted(units.values(), key=lambda u: u.rank or 0)
    for p in loose:  # console logs next to the rank files (a launcher's output)
        sub = merged_log(p)
        case.events += sub.events
        case.unattributed += sub.unattributed
        case.aborted = case.aborted or sub.aborted  # a job log's (slurm-%j.out) srun abort
        for su in sub.units:
            if su.rank is not None and su.rank in units:
                u = units[su.rank]
                u.exit_code = su.exit_code if su.exit_code is not None else u.exit_code
                u.signal = su.signal or u.signal
                u.order = su.order if su.order is not None else u.order
                u.node = su.node or u.node
                u.lines = sorted(u.lines + su.lines, key=lambda x: x.pos)
            elif su.rank is not None:
                case.units.append(su)
            else:
                case.unattributed += su.lines
        case.multi_host = sub.multi_host if case.multi_host is None else case.multi_host
    case.units.sort(key=lambda u: u.rank if u.rank is not None else -1)
    return case


# -- trebuchet runs --------------------------------------------------------------------------
OUTCOME = re.compile(r"^(rank|node|lost)-(\d+)\.json$")  # lost: a node lost


def is_run_dir(path: Path) -> bool:
    """A trebuchet run directory (a Slurm run sbatch refused has no attempts, but its
    job.json and events.jsonl)."""
    if not path.is_dir():
        return False
    marks = ("job.json", "events.jsonl")
    return any((path / m).is_file() for m in marks) or any(path.glob("attempt-*/"))


def _outcomes(adir: Path) -> dict[str, dict[str, Any]]:
    """The attempt's outcome records by name (rank-3, node-0, lost-1)."""
    outcomes = {}
    for p in sorted(adir.glob("*.json")) if adir.is_dir() else []:
        data = read_json(str(p)) if OUTCOME.match(p.name) else None
        if isinstance(data, dict):
            outcomes[p.stem] = data
    return outcomes


def _job(run_dir: Path) -> dict[str, Any]:
    """The run's job file (job.json), {} when absent or not an object."""
    job = read_json(str(run_dir / "job.json"))
    return job if isinstance(job, dict) else {}


def _gpus(run_dir: Path, job: dict[str, Any]) -> int | None:
    """GPUs per node the run had (a local run's TREB_NGPUS, else the resolved spec's
    gpus_per_node when it is a count); None when not known (gpus_per_node: -1 on Slurm)."""
    plan = job.get("plan")  # the processes, where the engine computed them (local)
    procs = (plan.get("procs") if isinstance(plan, dict) else None) or []
    ngpus = (procs[0].get("env") or {}).get("TREB_NGPUS") if procs else None
    if ngpus is not None and str(ngpus).isdigit():
        return int(ngpus)
    try:
        text = read_text(run_dir / "spec.yaml")
    except OSError:
        return None
    m = re.search(r"^gpus_per_node: (-?\d+)\s*$", text, re.M)
    return int(m.group(1)) if m and int(m.group(1)) >= 0 else None


def last_output(adir: Path) -> tuple[float, str, str] | None:
    """(time, whose, last line) of the attempt's latest write to a rank log (node logs
    under launcher: none); None when no log was written. A rank that wrote nothing counts
    from its log's creation."""
    found: tuple[float, str, str] | None = None
    logs = sorted(adir.glob("rank-*.log")) or sorted(adir.glob("node-*.log"))
    for log in logs:
        try:
            st = log.stat()
        except OSError:
            continue
        if found is None or st.st_mtime > found[0]:
            last = scanner.scan(log).last_lines if st.st_size else []
            whose = log.stem.replace("-", " ")
            found = (st.st_mtime, whose, last[-1] if last else "")
    return found


def _event_reason(run_dir: Path) -> tuple[str | None, str | None]:
    """(why, engine) of a run that ended before any rank started (its engine refused it,
    its environment build failed), from events.jsonl: for a run directory read without the
    store."""
    from trebuchet.store.files import read_events, refused_submission

    reason = engine = None
    for ev in read_events(run_dir):  # lines that are no JSON object skipped
        if ev.get("event") == "submitted":
            engine = ev.get("backend")
        elif ev.get("event") == "environment_failed":
            reason = f"environment build failed: {ev.get('error')}"
        elif refused_submission(ev) is not None:
            reason = refused_submission(ev)
    return reason, engine


def _environment_unit(log: Path, message: str, ended_at: float | None) -> Unit:
    lines, last = _scan_lines(log)
    lines.append(parse(f"treb: environment build failed: {message}", len(lines)))
    return Unit(rank=None, label="environment", exit_code=1, log=str(log), lines=lines,
                last_lines=last, ended_at=ended_at, order=0)  # fmt: skip


def _setup_unit(ff: dict[str, Any]) -> Unit:
    """A node whose setup failed before any rank started (the engine's first failure,
    label "setup": its message names the line; its log is the setup's output)."""
    lines, last = _scan_lines(Path(ff["log"])) if ff.get("log") else ([], [])
    node = ff.get("host") or (None if ff.get("node") is None else str(ff["node"]))
    return Unit(rank=None, node=node, label="setup", exit_code=ff.get("exit_code") or 1,
                log=ff.get("log"), lines=lines, last_lines=last, ended_at=ff.get("ended_at"),
                order=0)  # fmt: skip


def _before_ranks(run: dict[str, Any], ff: dict[str, Any] | None, adir: Path) -> Unit | None:
    """The one unit of a run that failed before or beside its ranks: its environment build,
    a node's setup, a node lost or unhealthy; None when the ranks' outcomes tell."""
    label = ff.get("label") if ff else None
    if ff and label == "environment":
        msg = ff.get("message") or "environment build failed"
        return _environment_unit(Path(ff["log"]), msg, ff.get("ended_at"))
    if ff and label == "setup":
        return _setup_unit(ff)
    if ff and label in NODE_CAUSES:  # a node's loss or failed health checks
        log = adir / f"health-{ff.get('node')}.log"  # (runtime/job/nodeloss.py, health.py)
        if label == "node_lost":
            log = Path(str(ff.get("log") or adir / f"ssh-{ff.get('node')}.log"))
        return Unit(rank=None, node=str(ff.get("node")), exit_code=1, ended_at=ff.get("ended_at"),
                    label=str(label), log=str(log) if log.is_file() else None)  # fmt: skip
    reason = run.get("reason") or ""
    env_log = adir.parent / "environment.log"
    if not ff and reason.startswith("environment build failed") and env_log.is_file():
        msg = reason.removeprefix("environment build failed").lstrip(": ") or "see its log"
        return _environment_unit(env_log, msg, run.get("ended_at"))  # Slurm: built here
    return None


def run_case(run: dict[str, Any], procs: list[dict[str, Any]] | None = None) -> Case:
    """A trebuchet run: `run` holds the RunRecord's fields (or what a run dir tells)."""
    run_dir = Path(run["run_dir"])
    ff = run.get("first_failure") or None
    attempt = ff.get("attempt", run.get("attempt", 0)) if ff else run.get("attempt", 0)
    adir = run_dir / f"attempt-{attempt}"
    job = _job(run_dir)
    case = Case(source=f"run {run.get('id', run_dir.name)}", run={**run, "attempt": attempt},
                in_store=True)  # fmt: skip
    assert case.run is not None  # given just above
    case.run["timeout"] = job.get("timeout")
    case.run["latest_attempt"] = run.get("attempt", 0)
    case.run["gpus"] = _gpus(run_dir, job)
    launcher = run.get("launcher") or job.get("launcher", "native")
    ppn = int(run.get("procs_per_node") or job.get("ppn") or 1)
    outcomes = _outcomes(adir)
    for row in procs or []:
        if row.get("attempt", attempt) != attempt:
            continue
        name = f"rank-{row['rank']}" if row.get("rank") is not None else f"node-{row['node']}"
        outcomes.setdefault(name, {**row, "stopped_by_launcher": bool(row["stopped_by_launcher"])})
    before = _before_ranks(run, ff, adir)
    if before is not None:
        case.units, case.first_failure = [before], 0
        return case
    units: list[Unit] = []
    if launcher in ("torchrun", "none"):
        for name, o in sorted(outcomes.items()):
            if not name.startswith("node-"):
                continue
            node = int(o.get("node", name.split("-")[1]))
            sub = merged_log(adir / f"{name}.log", node_hint=str(node))
            case.events += sub.events
            case.unattributed += sub.unattributed
            agent = _outcome_unit(o, adir / f"{name}.log", rank=None, node=str(node),
                                  label=f"node {node}")  # fmt: skip
            ranks = [u for u in sub.units if u.rank is not None]
            if launcher == "torchrun":
                for lr in range(ppn):
                    r = node * ppn + lr
                    found = next((u for u in ranks if u.rank == r), None)
                    u = found or Unit(rank=r)
                    lines, last = _scan_lines(adir / f"rank-{r}.log")
                    u.lines = sorted(u.lines + lines, key=lambda x: x.pos)
                    u.last_lines = last
                    u.node, u.local_rank, u.log = str(node), lr, str(adir / f"rank-{r}.log")
                    if u.exit_code is None and agent.stopped_by_launcher and agent.failed:
                        u.stopped_by_launcher = True
                    units.append(u)
            elif ranks:
                for u in ranks:
                    u.node = u.node or str(node)
                units += ranks
            else:
                agent.lines = sub.units[0].lines if sub.units else []
                agent.last_lines = sub.units[0].last_lines if sub.units else []
                units.append(agent)
    else:
        for name, o in sorted(outcomes.items(), key=lambda kv: int(kv[0].split("-")[1])):
            if not name.startswith("rank-"):
                continue
            log = adir / f"{name}.log"
            lines, last = _scan_lines(log, srun_labels=False)
            host = o.get("host") or (None if o.get("node") is None else str(o["node"]))
            units.append(_outcome_unit(o, log, rank=o.get("rank"), node=host,
                                       local_rank=o.get("local_rank"), lines=lines,
                                       last_lines=last, label=o.get("label")))  # fmt: skip
        # SkyPilot and Kubernetes keep the records on their nodes: their ranks' logs come
        # back without them (backends/node_logs.py), and are read all the same
        for log in sorted(adir.glob("rank-*.log")) if adir.is_dir() else []:
            rank = rank_from_name(log.name)
            if rank is None or f"rank-{rank}" in outcomes:
                continue
            lines, last = _scan_lines(log, srun_labels=False)
            units.append(Unit(rank=rank, node=str(rank // ppn), log=str(log), lines=lines,
                              last_lines=last))  # fmt: skip
    units += _unstarted(adir, outcomes, ppn, launcher)
    units.sort(key=lambda u: (u.rank is None, u.rank or 0))
    for u in units:  # the exception a rank recorded itself (torch's @record)
        if u.rank is not None:
            u.error = errorfile.for_rank(adir, u.rank)
    case.units = units
    if ff:
        for i, u in enumerate(units):
            same_rank = ff.get("rank") is not None and u.rank == ff.get("rank")
            same_agent = ff.get("rank") is None and u.rank is None and u.node in (
                str(ff.get("node")), ff.get("host"))  # fmt: skip
            if same_rank or same_agent:
                case.first_failure = i
                u.order = 0
                break
    case.multi_host = False if not _remote(run.get("backend") or registry.DEFAULT) else None
    if run.get("state") == "TIMEOUT":
        starts = [o["started_at"] for o in outcomes.values() if o.get("started_at")]
        ends = [o["ended_at"] for o in outcomes.values() if o.get("ended_at")]
        case.run["attempt_started_at"] = run.get("attempt_started_at") or (
            min(starts) if starts else run.get("started_at"))  # fmt: skip
        case.run["attempt_ended_at"] = run.get("attempt_ended_at") or (
            max(ends) if ends else run.get("ended_at"))  # fmt: skip
        case.run["last_output"] = last_output(adir)
    return case


def _unstarted(
    adir: Path, outcomes: dict[str, dict[str, Any]], ppn: int, launcher: str
) -> list[Unit]:
    """A node whose launcher (torchrun, mpirun, horovodrun) failed before any of its ranks
    started (not found on the node: runtime/process/unstarted.py): the launcher's own log is the
    evidence, as a unit of its own (rank None)."""
    if launcher not in ("torchrun", "mpirun", "horovod"):
        return []
    out = []
    for name, o in outcomes.items():
        if not name.startswith("node-") or not (o.get("exit_code") or o.get("signal")):
            continue
        node = int(o.get("node", name.split("-")[1]))
        if launcher == "torchrun":  # its workers' logs
            mine = range(node * ppn, (node + 1) * ppn)
            started = any((adir / f"rank-{r}.log").exists() for r in mine)
        else:  # one mpirun starts every rank
            started = any(n.startswith("rank-") for n in outcomes)
        if started:
            continue
        log = adir / f"{name}.log"
        lines, last = _scan_lines(log)
        out.append(_outcome_unit(o, log, rank=None, node=str(node), lines=lines,
                                 last_lines=last, label=f"node {node}"))  # fmt: skip
    return out


def _remote(engine: str) -> bool:
    """Whether the engine's ranks may run on several hosts (unknown engines: maybe)."""
    from trebuchet.backends import get_backend
    from trebuchet.errors import UserError

    try:
        return get_backend(engine).remote
    except UserError:
        return True


def run_dir_case(path: Path) -> Case:
    """A run directory given as a path (copied off a cluster, or without the store)."""
    job = _job(path)
    attempts = sorted(int(p.name.split("-")[1]) for p in path.glob("attempt-*") if p.is_dir())
    attempt = attempts[-1] if attempts else 0
    first: dict[str, Any] | None = None
    for o in _outcomes(path / f"attempt-{attempt}").values():
        if not o.get("exit_code") or o.get("stopped_by_launcher"):
            continue
        if first is None or (o.get("ended_at") or 0) < (first.get("ended_at") or 0):
            first = {**o, "attempt": attempt}
    reason, engine = (None, None) if first else _event_reason(path)
    run = {
        "id": path.name, "run_dir": str(path), "attempt": attempt, "first_failure": first,
        "launcher": job.get("launcher", "native"), "procs_per_node": job.get("ppn"),
        "state": "FAILED" if first or reason else None, "name": job.get("run_id", path.name),
        "reason": reason,
        "backend": engine if reason else None,  # the engine's word on a run it refused
    }  # fmt: skip
    case = run_case(run)
    case.in_store = False  # read from a path: its logs are files, not `treb logs` of a run
    return case


def paths_case(paths: list[Path]) -> Case:
    """Logs from anywhere: one run dir, one log dir, or log files (merged or per rank)."""
    if len(paths) == 1 and paths[0].is_dir():
        if is_run_dir(paths[0]):
            return run_dir_case(paths[0])
        return log_dir(paths[0])
    folders = [str(p) for p in paths if p.is_dir()]
    if folders:  # never silently left unread (only files were read)
        from trebuchet.errors import UserError

        raise UserError(f"{', '.join(folders)}: a folder is diagnosed on its own, not among "
                        f"other paths: treb diagnose {folders[0]}")  # fmt: skip
    files = [p for p in paths if p.is_file()]
    jobs = job_logs(files)
    if len(files) > 1 and any(p not in jobs and rank_from_name(p.name) is not None
                              for p in files):  # fmt: skip
        return _rank_logs(", ".join(str(p) for p in files), files, None)  # as their folder
    cases = [merged_log(p) for p in files]
    if len(cases) == 1:
        return cases[0]
    combined = Case(source=", ".join(str(p) for p in files))
    by_rank: dict[Any, Unit] = {}
    for c in cases:
        combined.events += c.events
        combined.unattributed += c.unattributed
        combined.notes += c.notes
        combined.aborted = combined.aborted or c.aborted
        for u in c.units:
            key = u.rank if u.rank is not None else f"{u.log}"
            if key in by_rank and u.rank is not None:
                old = by_rank[key]
                old.lines += u.lines
                old.exit_code = old.exit_code if old.exit_code is not None else u.exit_code
                old.signal = old.signal or u.signal
            else:
                by_rank[key] = u
        if c.multi_host:
            combined.multi_host = True
    combined.units = list(by_rank.values())
    if combined.multi_host is None and len(files) > 1:
        combined.multi_host = True  # one console log per node
    return combined
