"""Step and checkpoint marks, read by the goodput accounting (trebuchet/goodput/) and the
no-progress rule (job/life.next_step).

A rank marks exactly with one line of stdlib Python (`trebuchet.dist.mark("step", n)`
appends `<unix time> <kind> <n>` to `$TREB_MARKS`); without marks, the readers fall back
on what treb records anyway: the metrics points and the checkpoint folder's mtimes.
Total and bounded: any bytes give marks or nothing, never an exception.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Iterator, NamedTuple

from ..rundir.regular import open_fd
from .paths import COUNTED, MARKS_DIR, marks_path

STEP, CHECKPOINT, COMPUTE = "step", "checkpoint", "compute"
# compute: a rank reached its step's collective (runtime/watch/straggler.py)
KINDS = (STEP, CHECKPOINT, COMPUTE)
READ_MAX = 4 << 20  # bytes of a marks or metrics file read, its end
HEAD_MAX = 64 << 10  # ... and of its beginning, when it is longer
ENTRIES_MAX = 4096  # entries of the checkpoint folder looked at


class Mark(NamedTuple):
    t: float
    kind: str
    n: float | None


def _ends(path: str, read_max: int = READ_MAX) -> bytes:
    """A file's whole lines, or past `read_max` those of its first HEAD_MAX and last
    `read_max` bytes: the attempt's first step, its last checkpoint and step."""
    try:
        fd = open_fd(path)
    except OSError:
        return b""
    try:
        size = os.fstat(fd).st_size
        if size <= read_max:
            return os.pread(fd, read_max, 0)
        head = os.pread(fd, HEAD_MAX, 0)
        tail = os.pread(fd, read_max, size - read_max)
    except OSError:
        return b""
    finally:
        os.close(fd)
    head = head[: head.rfind(b"\n") + 1]  # the cut line of each part dropped
    tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else b""
    return head + tail


def _number(word: object) -> float | None:
    if isinstance(word, bool):
        return None
    try:
        value = float(word)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def parse_marks(data: bytes) -> list[Mark]:
    out: list[Mark] = []
    for raw in data.split(b"\n"):
        words = raw.split()
        if len(words) < 2 or len(words) > 3 or len(raw) > 200:
            continue
        t = _number(words[0].decode("ascii", "replace"))
        kind = words[1].decode("ascii", "replace").lower()
        if t is None or t < 0 or kind not in KINDS:
            continue
        n = _number(words[2].decode("ascii", "replace")) if len(words) == 3 else None
        if len(words) == 3 and n is None:
            continue
        out.append(Mark(t, kind, n))
    return out


def parse_points(data: bytes) -> list[Mark]:
    out: list[Mark] = []
    for raw in data.split(b"\n"):
        if not raw.startswith(b"{") or len(raw) > (1 << 16):
            continue
        try:
            point = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if not isinstance(point, dict):
            continue
        t, s = _number(point.get("t")), _number(point.get("s"))
        if point.get(COUNTED):  # a count of points (metric_reader.Writer), no step
            s = None
        if t is not None and t >= 0:
            out.append(Mark(t, STEP, s))
    return out


def _files(folder: str) -> Iterator[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names[:ENTRIES_MAX]:
        if not name.startswith("."):
            yield os.path.join(folder, name)


SCAN = 64 << 10  # bytes read of each file at least, however many an attempt has
_CHECKPOINT_LINE = re.compile(rb"^[^\n]* checkpoint[^\n]*$", re.MULTILINE)


LINES_MAX = 4096  # marks taken of one file: its first 1/8, its last 1/2, 1/2 checkpoints
ATTEMPT_MARKS_MAX = 1 << 18  # ... and of all an attempt's files (each its share)
ATTEMPT_READ_MAX = 256 << 20  # bytes read of all an attempt's files (each its share)


def _cut(data: bytes, lines: int, last: bool) -> int:
    at = len(data) if last else 0
    for _ in range(lines):
        at = data.rfind(b"\n", 0, max(0, at - 1)) + 1 if last else data.find(b"\n", at) + 1
        if at <= 0:
            return 0 if last else len(data)
    return at


def _file_marks(data: bytes, points: bool, lines: int = LINES_MAX) -> list[Mark]:
    """Its ends' lines, and of the middle only the checkpoint lines (one regex scan, in C):
    a rank that marks a million checkpoints in a burst costs what `lines` marks do."""
    parse = parse_points if points else parse_marks
    head_end = _cut(data, lines // 8, last=False)
    tail_start = _cut(data, lines // 2, last=True)
    if tail_start <= head_end:
        return parse(data)
    out = parse(data[:head_end]) + parse(data[tail_start:])
    if not points:
        found = _CHECKPOINT_LINE.findall(data, head_end, tail_start)[-(lines // 2) :]
        out += parse_marks(b"\n".join(found))
    return out


def attempt_marks(adir: str) -> list[Mark]:
    """Every rank's marks of one attempt, in time order; the metrics' steps when no rank
    marked one. Bounded however many files a rank wrote: the controller reads them
    between attempts."""

    def each(paths: list[str], points: bool) -> list[Mark]:
        read = min(READ_MAX, max(SCAN, ATTEMPT_READ_MAX // max(1, len(paths))))
        lines = max(16, min(LINES_MAX, ATTEMPT_MARKS_MAX // max(1, len(paths))))
        return [m for p in paths for m in _file_marks(_ends(p, read), points, lines)]

    marks = each(list(_files(os.path.join(adir, MARKS_DIR))), False)
    if not any(m.kind in (STEP, COMPUTE) for m in marks):
        found = [p for p in _files(os.path.join(adir, "metrics")) if p.endswith(".jsonl")]
        marks += each(found, True)
    marks.sort(key=lambda m: m.t)
    return marks


def folder_checkpoints(folder: str) -> list[Mark]:
    """A hidden entry ('.'), a checkpoint being written, is not one yet."""
    out: list[Mark] = []
    for path in _files(folder):
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            continue
        if math.isfinite(mtime):
            out.append(Mark(mtime, CHECKPOINT, None))
    out.sort(key=lambda m: m.t)
    return out


def checkpoint_folder(run_dir: str) -> str:
    try:
        data = json.loads(_ends(os.path.join(run_dir, "job.json")) or b"null")
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("checkpoint_dir"), str):
        return str(data["checkpoint_dir"])
    return os.path.join(run_dir, "checkpoints")


def checkpoint_steps(marks: list[Mark]) -> list[float]:
    """The step each checkpoint of one attempt's marks (in time order) holds: its own
    number, else the highest step marked before it (the ranks' step or compute marks, or
    the metrics').
    A checkpoint with neither is left out: a line that names no step ("checkpoint saved")
    cannot tell a resumed attempt that moved on from a crash loop that saves the same
    state again, so it proves no progress by itself."""
    reached: float | None = None
    out: list[float] = []
    for m in marks:
        if m.kind in (STEP, COMPUTE) and m.n is not None:  # compute n: step n's collective
            reached = m.n if reached is None else max(reached, m.n)
        elif m.kind == CHECKPOINT:
            held = m.n if m.n is not None else reached
            if held is not None:
                out.append(held)
    return out


def progressed(run_dir: str, attempt: int, started: float) -> bool | None:
    """Did the attempt keep any work: a checkpoint of a step past the run's last one
    before it (checkpoint_steps), or an entry of the checkpoint folder written since it
    started? None when the run has shown no checkpoint at all: nothing says what progress
    is then."""
    shown = False
    before: list[float] = []
    for a in range(attempt):
        marks = attempt_marks(os.path.join(run_dir, f"attempt-{a}"))
        shown = shown or any(m.kind == CHECKPOINT for m in marks)
        before += checkpoint_steps(marks)
    adir = os.path.join(run_dir, f"attempt-{attempt}")
    marks = attempt_marks(adir)
    shown = shown or any(m.kind == CHECKPOINT for m in marks)
    folder = folder_checkpoints(checkpoint_folder(run_dir))
    if not (shown or folder):
        return None
    best = max(before, default=None)
    if any(best is None or n > best for n in checkpoint_steps(marks)):
        return True
    numbered = any(m.kind in (STEP, COMPUTE) and m.n is not None for m in marks)
    if not numbered and _saved_again(adir, marks):
        return True
    return any(m.t >= started for m in folder)


POINT_T = 0.001  # a metrics point's time is kept to the ms: read with the save, it may be later


def _saved_again(adir: str, marks: list[Mark]) -> bool:
    """Did a rank say a checkpoint without a step, train (a step mark or a metrics line
    of any rank, numbered or not), and say one again? Work kept, though no step says how
    much. One save an attempt (a crash loop's, as it starts or as it dies), or a save's
    two lines (`Saving model to ...`, then `checkpoint saved`), proves none."""
    trained = sorted(m.t for m in marks if m.kind in (STEP, COMPUTE))
    for path in _files(os.path.join(adir, MARKS_DIR)):
        times = sorted(m.t for m in _file_marks(_ends(path, SCAN), False, 64)
                       if m.kind == CHECKPOINT and m.n is None)  # fmt: skip
        for a, b in zip(times, times[1:]):
            at = bisect.bisect_right(trained, a)
            if at < len(trained) and trained[at] <= b + POINT_T:
                return True
    return False


# What the HuggingFace Trainer, Lightning, Megatron-LM and DeepSpeed print once they save
# (real lines: tests/fixtures/trainers/). The spec's `checkpoint_pattern` replaces it.
DEFAULT_CHECKPOINT_PATTERN = (
    r"(?i)saving model checkpoint to |saving model to |successfully saved checkpoint"
    r"|checkpoint \S+ is ready now|checkpoint saved"
)
_CHECKPOINT_N = re.compile(rb"(?i)(?:checkpoint-|global_step|\bstep[=_ ]|iteration\s+)(\d{1,15})")
LINE_MARKS = ".from-log"  # marks/<name>.from-log: the checkpoints the agent saw in a log


LINE_SCAN = 4096  # bytes of a line a spec's own pattern looks at (a checkpoint line is short)
PATTERN_CPU_S = 0.05  # CPU seconds a spec's pattern may take on one line
PATTERN_TOTAL_S = 5.0  # ... and on all lines, before it is turned off for the attempt
SAME_MARK_S = 1.0  # the same checkpoint said again within this: one mark


class _Slow(Exception):
    """SIGVTALRM interrupts a spec's pattern that took its CPU budget on a line."""


_ARMED = [False]  # a search runs under the timer: the signal interrupts it (one process)


def _ring(signum: int, frame: object) -> None:
    if _ARMED[0]:
        _ARMED[0] = False
        raise _Slow()


class LineCheckpoints:
    """A checkpoint line of a log as a checkpoint mark, as if the rank had marked it.

    A spec's pattern runs on every line a rank prints: each search runs under a CPU timer
    that interrupts catastrophic backtracking, and a pattern over its budget is turned off
    for the attempt. One checkpoint said again within SAME_MARK_S is one mark."""

    def __init__(self, adir: str, pattern: str) -> None:
        self.adir = adir
        self.rx: re.Pattern[bytes] | None = re.compile(pattern.encode())
        self.default = pattern == DEFAULT_CHECKPOINT_PATTERN
        self.made = False
        self.spent = 0.0  # CPU seconds the spec's pattern took
        self.last: dict[str, tuple[float | None, float]] = {}  # name: (n, time) last marked

    def _search(self, line: bytes) -> re.Match[bytes] | None:
        assert self.rx is not None
        if self.default:  # the default's words absent: no regex run (most lines)
            if b"heckpoint" not in line and b"aving model" not in line:
                return None
            return self.rx.search(line)
        line = line[:LINE_SCAN]
        timed = self._arm()
        cpu = time.process_time()
        slow = False
        try:
            try:
                m = self.rx.search(line)
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
                _ARMED[0] = False
        except _Slow:
            m, slow = None, True
        self.spent += time.process_time() - cpu
        if slow or self.spent > PATTERN_TOTAL_S:
            self.rx = None
            sys.stderr.write("treb: checkpoint_pattern took more than its CPU budget on "
                             "a line of the log; not looked for in this attempt\n")  # fmt: skip
        return m

    def _arm(self) -> bool:
        """Only where SIGVTALRM and its timer are no one else's, in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            if signal.getsignal(signal.SIGVTALRM) not in (signal.SIG_DFL, _ring):
                return False
            if signal.getitimer(signal.ITIMER_VIRTUAL)[0]:
                return False
            signal.signal(signal.SIGVTALRM, _ring)
            _ARMED[0] = True
            signal.setitimer(signal.ITIMER_VIRTUAL, PATTERN_CPU_S)
        except (ValueError, OSError, AttributeError):
            _ARMED[0] = False
            return False
        return True

    def __call__(self, name: str, line: bytes) -> None:
        if self.rx is None:
            return
        m = self._search(line)
        if m is None:
            return
        step = m.groupdict().get("step")
        # the line's last step-like number: a path's folders come before its checkpoint's
        last = deque(_CHECKPOINT_N.finditer(line) if step is None else (), maxlen=1)
        found = last[0] if last else None
        n = _number(step.decode("ascii", "replace")) if step is not None else None
        if found is not None:
            n = _number(found[1].decode())
        wall = time.time()
        said = self.last.get(name)
        if said is not None and said[0] == n and 0 <= wall - said[1] < SAME_MARK_S:
            return
        self.last[name] = (n, wall)
        from ..rundir.records import write_regular

        text = f"{wall:.6f} {CHECKPOINT}" + ("" if n is None else f" {n:g}") + "\n"
        with contextlib.suppress(OSError):
            if not self.made:
                os.makedirs(os.path.join(self.adir, MARKS_DIR), mode=0o700, exist_ok=True)
                self.made = True
            write_regular(marks_path(self.adir, name + LINE_MARKS), text.encode())


def pattern_risk(pattern: str) -> str | None:
    """Why a regex may backtrack catastrophically on a line (`(a+)+`, `(.*a){12}`, `(x|x)*`,
    a backreference), else None: said at `treb check` time; the CPU budget bounds the rest."""
    from .log_policies import MAXREPEAT, bodies, regex_tree

    try:
        tree = regex_tree(pattern.encode())
    except (re.error, ValueError, RecursionError, OverflowError):
        return None  # the compile says what is wrong

    def walk(items: Any, within: int) -> str | None:
        """`within`: 0 outside repeats, 1 inside a bounded one, 2 an unbounded one."""
        for op, av in items:
            name = str(op)
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "a backreference"
            if name in ("MAX_REPEAT", "MIN_REPEAT"):
                high = av[1]
                if high == MAXREPEAT and within:
                    return "an unbounded repeat inside a repeat"
                found = walk(av[2], max(within, 2 if high == MAXREPEAT else int(high > 1)))
            elif name == "BRANCH" and within == 2:
                return "alternatives inside an unbounded repeat"
            else:
                found = next((w for b in bodies(name, av) if (w := walk(b, within))), None)
            if found:
                return found
        return None

    return walk(tree, 0)


def checkpoint_lines(adir: str, config: dict[str, object]) -> LineCheckpoints | None:
    pattern = config.get("checkpoint_pattern")
    if pattern is None:
        pattern = DEFAULT_CHECKPOINT_PATTERN
    if not isinstance(pattern, str) or not pattern:
        return None
    try:
        return LineCheckpoints(adir, pattern)
    except (re.error, ValueError, UnicodeEncodeError, OverflowError, RecursionError):
        return None  # a rewritten metrics.json's pattern: none, never an agent's end


def chain(*hooks: Callable[[str, bytes], None] | None) -> Callable[[str, bytes], None] | None:
    found = [h for h in hooks if h is not None]
    if len(found) <= 1:
        return found[0] if found else None

    def every(name: str, line: bytes) -> None:
        for h in found:
            h(name, line)

    return every
