"""A hang in words: where each rank is stuck, from the stacks the agents dumped.

Each rank's stack file (py-spy's or faulthandler's) is read down to its main thread's
innermost Python frame, innermost user frame and innermost telling native frame (DDP's
backward waits in `c10d::Reducer`, not in a Python collective). Ranks are grouped by (what,
where, stopped), those waiting in a collective first, into one line:

    hang: 3 of 4 ranks wait in all_reduce (train.py:14); rank 3 is in time.sleep
    (train.py:12), silent for 21s

The rank named stuck, in order: the one stopped rank (SIGSTOP, `# state stopped`); the one
not in a collective while the others are; the one whose stack differs from all others';
else the one that went silent first. A rank without a stack is named by node and reason
once. Silence is judged against each rank's own habit (hang.json `habits`): so under the HF
Trainer, where only rank 0 prints, a rank quiet since its start is no suspect.

Stdlib and the runtime only (the local supervisor prints a hang as it happens); files a
rank can reach are read as regular files only.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trebuchet.runtime.rundir.records import read_json
from trebuchet.runtime.rundir.regular import open_regular, read_text
from trebuchet.runtime.watch.display_lines import shown

HOST = re.compile(r"^# host (\S+)", re.M)
TRIED = re.compile(r"^# tried: (.*)$", re.M)
SILENT_GAP_S = 2.0  # a rank silent this much longer than every other went silent first
HABIT_EVENTS = 3  # a rank progressed this many times before its silence can be judged
HABIT_FACTOR = 3.0  # ... and was quiet this many times its usual gap
STOPPED = re.compile(r"^# state stopped\s*$", re.M)
STOPPED_TEXT = ", stopped (SIGSTOP or a debugger)"
# The stack files (and hang.json's names) of an attempt: a rank can write the folder, so a
# name that is none of these (rank-², rank-x.txt) is no rank.
NAME = re.compile(r"^(rank|node)-(0|[1-9][0-9]{0,6})$")
STACK_MAX = 4 << 20  # a stack file's bytes read (a rank can make one a sparse 64 GiB)
SILENCE_MAX = 1e9  # seconds: a planted time in hang.json says no more than this
SOURCE_MAX = 1 << 20  # the bytes of a user's source file looked through for its line
# Native frames of a rank that waits for its peers (DDP's reducer, gloo, NCCL).
NATIVE_COLLECTIVE = re.compile(r"c10d::|gloo::|nccl|ProcessGroup", re.I)
PY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
NATIVE_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<lib>[^():]+)\)\s*$")
FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
PYSPY_THREAD = re.compile(r'^Thread (?P<id>\S+) \((?P<state>[^)]*)\)(?:: "(?P<name>.*)")?')
FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>\S+)")
LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d\.\d+/|^<frozen |^<")
# Native frames that only say "waiting": the frame under them tells more.
WAITS = re.compile(r"^(0x[0-9a-f]+|pthread_|__?futex|clock_nanosleep|nanosleep|__?poll|"
                   r"epoll_|select|syscall|std::condition_variable|pybind11::|_PyEval|"
                   r"PyObject_|cfunction_|method_vectorcall|_?PyFunction)")  # fmt: skip
CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
NOT_CALLS = {"if", "while", "for", "return", "print", "assert", "with", "elif", "not", "and",
             "or", "in", "lambda", "yield", "await"}  # fmt: skip
COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "barrier", "reduce", "gather", "scatter",
               "all_to_all", "all_to_all_single", "send", "recv", "monitored_barrier",
               "all_gather_object", "broadcast_object_list", "init_process_group"}  # fmt: skip


@dataclass
class Frame:
    func: str
    file: str = ""
    line: int = 0
    lib: str = ""  # native frames: the shared object

    @property
    def python(self) -> bool:
        return not self.lib

    @property
    def user(self) -> bool:
        return self.python and not LIBRARY.search(self.file)

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


@dataclass
class RankStack:
    name: str  # rank-3 (node-0 under launcher none)
    method: str = "none"
    frames: list[Frame] = field(default_factory=list)  # the main thread's, innermost first
    what: str = "?"
    where: str = ""
    native: str = ""
    silent: float | None = None
    host: str = ""  # the node whose agent dumped it (older files: unknown)
    why: str = ""  # why there is no stack (method none)
    stopped: bool = False  # its process was stopped (state T) when its stack was read

    @property
    def label(self) -> str:
        return self.name.replace("-", " ")

    @property
    def waits(self) -> bool:
        """It waits for its peers: in a collective, or in DDP's reducer / gloo / NCCL."""
        return self.what in COLLECTIVES or bool(NATIVE_COLLECTIVE.search(self.native))


def parse(text: str) -> tuple[str, list[Frame]]:
    """(method, the main thread's frames innermost first) of one stack file."""
    method, pid = "none", ""
    m = re.search(r"^# request \S+ method (\S+(?: --native| --nonblocking)?)(?: pid (\d+))?",
                  text, re.M)  # fmt: skip
    if m:
        method, pid = m.group(1), m.group(2) or ""
    threads: list[tuple[str, list[Frame]]] = []
    ids: list[str] = []
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        t = PYSPY_THREAD.match(raw) or FH_THREAD.match(raw)
        if t:
            threads.append((t.groupdict().get("name") or "", []))
            ids.append(t["id"])
            continue
        if not threads:
            continue
        f = FH_FRAME.match(raw) or PY_FRAME.match(raw)
        if f:
            threads[-1][1].append(Frame(f["func"], f["file"], int(f["line"])))
            continue
        f = NATIVE_FRAME.match(raw)
        if f:
            threads[-1][1].append(Frame(f["func"], lib=f["lib"]))
    # the main thread's id is the pid (a rank can name any thread MainThread)
    main = next((fr for i, (_, fr) in zip(ids, threads, strict=True) if pid and i == pid), None)
    if main is None:
        main = next((fr for name, fr in threads if name == "MainThread"), None)
    if main is None:  # faulthandler: the thread whose outermost Python frame is <module>
        main = next((fr for _, fr in threads if any(x.func == "<module>" for x in fr)), None)
    if main is None:
        main = threads[0][1] if threads else []
    return method, main


def _source_call(frame: Frame) -> str | None:
    """The call on a user frame's line (`time.sleep` of `time.sleep(3600)`)."""
    try:
        with open_regular(frame.file) as fh:
            head = fh.read(SOURCE_MAX)  # a path in a stack file: any file, any size
    except OSError:
        return None
    lines = head.split(b"\n", frame.line)
    if frame.line < 1 or len(lines) < frame.line:
        return None
    text = lines[frame.line - 1][:4096].decode(errors="replace")
    for name in CALL.findall(text.strip()):
        if name not in NOT_CALLS:
            return name
    return None


def analyse(rs: RankStack) -> None:
    """Fill what (the call it is in), where (file:line of the user's frame), native."""
    py = [f for f in rs.frames if f.python]
    if not py:
        rs.what = "no Python frames" if rs.method != "none" else "no stacks"
        return
    user = next((f for f in py if f.user), py[0])
    rs.where = user.where
    inner = py[0]
    natives = [f for f in rs.frames[: rs.frames.index(inner)] if not f.python]
    telling = [f for f in natives if not WAITS.match(f.func)]
    rs.native = telling[0].func[:120] if telling else ""
    if not inner.user:
        rs.what = inner.func.rsplit(".", 1)[-1] if "<locals>" in inner.func else inner.func
    else:
        rs.what = _source_call(inner) or (rs.native or inner.func)


def read_stacks(adir: Path, names: list[str] | None = None) -> list[RankStack]:
    folder = adir / "stacks"
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    out = []
    for path in files:
        if not NAME.match(path.stem) or (names is not None and path.stem not in names):
            continue
        try:
            text = read_text(path, STACK_MAX)
        except OSError:
            continue
        method, frames = parse(text)
        host = HOST.search(text)
        rs = RankStack(path.stem, method, frames, host=host.group(1) if host else "",
                       stopped=bool(STOPPED.search(text)))  # fmt: skip
        rs.why = why_none(text) if method == "none" else ""
        analyse(rs)
        out.append(rs)
    return sorted(out, key=_order)


def why_none(text: str) -> str:
    """Why a stack file has no stack, in a few words, from its `# tried:` lines."""
    tried = TRIED.findall(text)
    if any(t.startswith("py-spy not found") for t in tried):
        return "py-spy not found there"
    spy = [t for t in tried if not t.startswith("faulthandler")]
    if spy:
        return spy[-1][:120]
    return "py-spy and faulthandler were not usable there"


def _order(rs: RankStack) -> tuple[int, int]:
    kind, _, num = rs.name.partition("-")
    return (kind != "rank", int(num) if num.isdigit() else 0)


def _names(ranks: list[RankStack]) -> str:
    nums = [r.name.partition("-")[2] for r in ranks]
    kind = ranks[0].name.partition("-")[0]
    listed = ", ".join(nums[:8]) + (f" and {len(nums) - 8} more" if len(nums) > 8 else "")
    return f"{kind}{'s' if len(nums) > 1 else ''} {listed}"


def _human(seconds: float) -> str:
    from trebuchet.spec.duration import human

    return human(min(max(0.0, seconds), 1e9)) if math.isfinite(seconds) else "?"


def summary(
    ranks: list[RankStack],
    total: int,
    missing: list[str],
    silence: dict[str, float] | None = None,
    habits: Habits | None = None,
) -> str:
    """The one line: the ranks that wait in a collective (the biggest group of them); the
    others, with how long they were silent; the nodes that gave no stacks, and then the
    rank that went silent first (`habits`: judged against each rank's pace)."""
    parts, apart = _grouped([r for r in ranks if r.method != "none"], total)
    bare = [r for r in ranks if r.method == "none"]
    parts += _no_stacks(bare, every=len(bare) == total)
    if missing:
        parts.append(f"no stacks from {', '.join(missing[:8])}")
    first = first_silent(silence or {}, habits)
    if first is not None and first[0] not in apart:  # not already named with its silence
        name, gone, others = first
        than = f" (the others {_human(others)} or less)" if others is not None else ""
        parts.append(f"{name.replace('-', ' ')} went silent first, {_human(gone)} before the "
                     f"hang was seen{than}")  # fmt: skip
    return "hang: " + "; ".join(parts)


def _no_stacks(bare: list[RankStack], every: bool) -> list[str]:
    """'no stacks on tn2: py-spy not found there', once per node and reason."""
    by: dict[tuple[str, str], list[RankStack]] = {}
    for r in bare:
        by.setdefault((r.host, r.why), []).append(r)
    out = []
    for (host, why), members in by.items():
        who = "" if every and len(by) == 1 else f" ({_names(members)})"
        out.append(f"no stacks on {host}{who}: {why}" if host else
                   f"no stacks from {_names(members)}: {why}")  # fmt: skip
    return out


Habits = dict[str, dict[str, Any]]  # hang.json `habits`: {rank-0: {count, first, last, gap}}
Silent = tuple[str, float, float | None]  # first_silent: name, silent for, the others at most


def first_silent(silence: dict[str, float], habits: Habits | None = None) -> Silent | None:
    """(name, silent for, the others at most) of the rank that went silent first, from
    the progress times; None when none stands out. Without `habits` (older hang.json):
    the rank silent SILENT_GAP_S longer than every other one. With them: among the ranks
    that keep a pace (`paced`), the one quiet longest before the run's last progress,
    SILENT_GAP_S longer than the next one; a rank that never printed is no suspect."""
    if habits is None:
        if len(silence) < 2:
            return None
        (name, top), (_, second) = sorted(silence.items(), key=lambda kv: (-kv[1], kv[0]))[:2]
        return (name, top, second) if top - second >= SILENT_GAP_S else None
    lasts = {n: _field(h, "last") for n, h in habits.items()}
    if not any(v is not None for v in lasts.values()):
        return None
    end = max(v for v in lasts.values() if v is not None)  # the run's last progress
    quiet = {
        n: end - (lasts[n] or 0.0) for n, h in habits.items() if n in silence and paced(h, end)
    }
    if not quiet:
        return None
    ordered = sorted(quiet.items(), key=lambda kv: (-kv[1], kv[0]))
    name, top = ordered[0]
    if len(ordered) > 1 and top - ordered[1][1] < SILENT_GAP_S:
        return None
    rest = [s for n, s in silence.items() if n != name and _count(habits.get(n)) >= HABIT_EVENTS]
    return name, silence[name], (max(rest) if rest else None)


def _field(habit: Any, key: str) -> float | None:
    """A finite number of a habit (hang.json is in a folder ranks can write), else None."""
    value = habit.get(key) if isinstance(habit, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)  # an int past a float's range: OverflowError
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _count(habit: Any) -> int:
    return int(_field(habit, "count") or 0)


def paced(habit: Any, end: float) -> bool:
    """A rank whose silence at the run's last progress (`end`) breaks its own habit: it
    progressed HABIT_EVENTS times or more, for at least as long as it has been quiet since,
    and is quiet HABIT_FACTOR times its usual gap (and SILENT_GAP_S) or longer."""
    count, first, last, gap = (_field(habit, k) for k in ("count", "first", "last", "gap"))
    if count is None or first is None or last is None or gap is None:
        return False
    quiet = end - last
    return (count >= HABIT_EVENTS and last - first >= quiet
            and quiet >= max(SILENT_GAP_S, HABIT_FACTOR * gap))  # fmt: skip


def stuck(ranks: list[RankStack], first: Silent | None) -> RankStack | None:
    """The rank the stacks show stuck (see the module's docstring), else the one that went
    silent first (`first`), else None."""
    with_stacks = [r for r in ranks if r.method != "none"]
    halted = [r for r in ranks if r.stopped]
    if len(halted) == 1 and len(ranks) > 1:
        return halted[0]
    apart = [r for r in with_stacks if not r.waits]
    if len(apart) == 1 and len(with_stacks) > 1:
        return apart[0]
    groups: dict[tuple[str, str], list[RankStack]] = {}
    for r in with_stacks:
        groups.setdefault((r.what, r.where), []).append(r)
    singles = [g[0] for g in groups.values() if len(g) == 1]
    if apart:  # some are outside a collective: one waiting in it is no cause, but their victim
        singles = [r for r in singles if not r.waits]
    if len(groups) > 1 and len(singles) == 1:
        return singles[0]
    if first is not None:  # no stacks tell: the progress times do
        return next((r for r in ranks if r.name == first[0]), RankStack(first[0]))
    return None


def _grouped(ranks: list[RankStack], total: int) -> tuple[list[str], set[str]]:
    """The groups of ranks with stacks (at most four): those that wait in a collective
    first, the biggest first, a stopped rank on its own; and the names of the ranks said
    apart from the first group, with their silence."""
    groups: dict[tuple[str, str, bool], list[RankStack]] = {}
    for r in ranks:
        groups.setdefault((r.what, r.where, r.stopped), []).append(r)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][2], not kv[1][0].waits,
                                                     -len(kv[1]), _order(kv[1][0])))  # fmt: skip
    parts = []
    for i, ((what, where, halted), members) in enumerate(ordered[:4]):
        at = f" ({where})" if where else ""
        native = ""
        if members[0].native and what not in COLLECTIVES and "::" in members[0].native:
            native = f" [native: {members[0].native}]"
        state = STOPPED_TEXT if halted else ""  # the first group too
        if i == 0 and len(ordered) > 1 and len(members) == 1:
            parts.append(f"{members[0].label} waits in {what}{at}{native}{state}")
        elif i == 0 and len(ordered) > 1:
            parts.append(f"{len(members)} of {total} ranks wait in {what}{at}{native}{state}")
        elif i == 0:
            every = "all" if len(members) == total else f"{len(members)} of"
            parts.append(f"{every} {total} ranks wait in {what}{at}{native}{state}")
        else:
            verb = "is" if len(members) == 1 else "are"
            silent = [m.silent for m in members if m.silent is not None]
            quiet = f", silent for {_human(max(silent))}" if silent else ""
            parts.append(f"{_names(members)} {verb} in {what}{at}{native}{state}{quiet}")
    if len(ordered) > 4:
        parts.append(f"{len(ordered) - 4} more group(s)")
    apart = {m.name for _, members in ordered[1:4] for m in members}
    return parts, apart


@dataclass
class Hang:
    info: dict[str, Any]
    ranks: list[RankStack]
    line: str
    odd: RankStack | None  # the one rank apart from the rest, when there is one
    stacks_dir: str


def read(adir: Path) -> Hang | None:
    """The attempt's hang (hang.json and its stacks), or None when it had none."""
    adir = Path(adir)
    info = _clean(read_json(str(adir / "hang.json")), adir / "hang.json")
    if info is None:
        return None
    expected = info["expected"]
    # the stacks of the attempt's ranks only: a rank can put a file of any name there
    asked = [n for n in info["stacks"] if n in expected] if expected else info["stacks"]
    ranks = read_stacks(adir, asked or (expected or None))
    detected, started = info["detected_at"], info["last_progress"]
    habits = info["habits"]
    silence = {n: _silent(adir, n, detected, started, habits) for n in expected}
    for r in ranks:
        r.silent = silence.get(r.name, _silent(adir, r.name, detected, started, habits))
    got = {r.name for r in ranks}
    missing = [n.replace("-", " ") for n in expected if n not in got]
    line = summary(ranks, len(expected) or len(ranks), missing, silence, habits)
    odd = stuck(ranks, first_silent(silence, habits))
    return Hang(info, ranks, line, odd, str(adir / "stacks"))


def _clean(raw: Any, path: Path) -> dict[str, Any] | None:
    """hang.json's fields as the readers use them, whatever a rank wrote there (it is in
    the attempt's folder): finite times (else the file's own time), a known action, rank
    names only; None when it is no hang record at all."""
    if not isinstance(raw, dict):
        return None

    def names(key: str) -> list[str]:
        value = raw.get(key)
        if not isinstance(value, list):
            return []
        return [n for n in value if isinstance(n, str) and NAME.match(n)]

    try:
        made = path.stat().st_mtime
    except OSError:
        made = time.time()
    detected = _field(raw, "detected_at")
    detected = made if detected is None else detected
    last = _field(raw, "last_progress")
    last = detected if last is None else min(last, detected)
    timeout = _field(raw, "hang_timeout")
    action = raw.get("action")
    habits = raw.get("habits")
    return {**raw, "detected_at": detected, "last_progress": last,
            "hang_timeout": timeout if timeout is not None and timeout >= 0 else None,
            "action": action if action in ("fail", "retry", "warn") else "fail",
            "expected": names("expected"), "stacks": names("stacks"),
            "habits": habits if isinstance(habits, dict) else None}  # fmt: skip


def _silent(
    adir: Path, name: str, detected: float, started: float, habits: Habits | None = None
) -> float:
    """How long `name` had made no progress when the hang was seen: its last progress the
    hang watch saw (`habits`; the progress file changes after, with what a rank prints as
    it is stopped), else its progress file's mtime; without either, since the attempt's
    last progress."""
    seen = _field((habits or {}).get(name), "last")
    if seen is None:
        try:
            seen = (adir / "progress" / name).stat().st_mtime
        except OSError:
            seen = started
    return min(detected - min(seen, detected), SILENCE_MAX)  # planted times: still finite


def hang_lines(adir: Path) -> list[str]:
    """Two lines: the grouping, and where the stacks are."""
    h = read(adir)
    return _lines(h) if h is not None else []


def _lines(h: Hang) -> list[str]:
    action = h.info["action"]
    silent = h.info["detected_at"] - h.info["last_progress"]
    limit = h.info["hang_timeout"]
    then = {"fail": "the run is stopped", "retry": "the attempt is stopped and retried",
            "warn": "the run goes on (on_hang: warn)"}.get(action, "")  # fmt: skip
    return [
        h.line,
        f"no rank made progress for {_human(silent)} (hang_timeout "
        f"{'?' if limit is None else f'{limit:g}'}s): {then}; stacks in {h.stacks_dir}",
    ]


def grouped_text(ranks: list[RankStack], texts: dict[str, str]) -> str:
    """`treb stacks`: ranks with the same main-thread stack once, the others after."""
    groups: dict[tuple[object, ...], list[RankStack]] = {}
    for r in ranks:
        key = tuple((f.func, f.file, f.line) for f in r.frames if not f.func.startswith("0x"))
        groups.setdefault((key, r.stopped, r.why), []).append(r)
    out = []
    for members in sorted(groups.values(), key=lambda g: (-len(g), _order(g[0]))):
        first = members[0]
        if first.method == "none":  # what was tried, and py-spy's own reason
            out += [f"== {_names(members)}: no stacks: {first.why}", ""]
            continue
        state = STOPPED_TEXT if first.stopped else ""
        out.append(f"== {_names(members)} ({first.method}{state}): in {first.what}"
                   + (f" ({first.where})" if first.where else ""))  # fmt: skip
        body = [ln for ln in texts.get(first.name, "").splitlines() if not ln.startswith("# ")]
        out += ["   " + ln for ln in body if ln.strip()]
        out.append("")
    return "\n".join(shown(ln) for ln in out)


def for_run(run: dict[str, Any]) -> dict[str, Any] | None:
    """The Diagnosis fields of a run whose attempt was stopped for a hang, else None."""
    if not run.get("run_dir") or run.get("state") in ("SUCCEEDED", "RUNNING", "PENDING"):
        return None
    adir = Path(run["run_dir"]) / f"attempt-{int(run.get('attempt') or 0)}"
    h = read(adir)
    if h is None or h.info.get("action") == "warn":
        return None
    evidence = _lines(h)[1:]
    for r in h.ranks:
        native = f" [native: {r.native}]" if r.native else ""
        state = STOPPED_TEXT if r.stopped else ""
        how = f"stacks by {r.method}" if r.method != "none" else f"no stacks: {r.why}"
        evidence.append(f"{r.label}: in {r.what} ({r.where or '?'}){native}{state}, {how}, "
                        f"silent for {_human(r.silent or 0.0)}")  # fmt: skip
    rank = int(h.odd.name.partition("-")[2]) if h.odd and h.odd.name.startswith("rank-") else None
    log = str(adir / f"{h.odd.name}.log") if h.odd else None
    return {"summary": h.line.removeprefix("hang: "), "rank": rank, "evidence": evidence,
            "log": log}  # fmt: skip


def warned_lines(run_dir: str, attempt: int) -> list[str]:
    """The hang an attempt that goes on reported (on_hang: warn), for `treb status`."""
    h = read(Path(run_dir) / f"attempt-{attempt}")
    return [f"warning: {line}" for line in _lines(h)] if h and h.info["action"] == "warn" else []
