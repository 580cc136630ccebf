"""Step and checkpoint marks: what a rank says of its own training, and the checkpoints
seen in `TREB_CHECKPOINT_DIR`, read by the goodput accounting (trebuchet/goodput/) and by
the rule that stops a run whose attempts make no progress (job/life.next_step).

A rank may mark its steps and checkpoints exactly with one line of stdlib Python
(`trebuchet.dist.mark("step", n)` does it): it appends `<unix time> <kind> <n>` to the
file `$TREB_MARKS` (`attempt-<n>/marks/<rank name>`, which the agent sets for every rank).
Without marks, the readers fall back on what treb records anyway: the metrics points
(`attempt-<n>/metrics/*.jsonl`, whose `t` and `s` are a step's time and number) and the
entries of the checkpoint folder (each one's mtime a checkpoint's time).

Total and bounded: any bytes in these files give marks or nothing, never an exception;
a time or number that is not finite is dropped; of a file longer than `READ_MAX`, its
first `HEAD_MAX` and last `READ_MAX` bytes are read, whole lines only, and at most
`ENTRIES_MAX` entries of the checkpoint folder.
Stdlib only: it ships in the runtime file.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from typing import Callable, Iterator, NamedTuple

from ..rundir.regular import open_fd

MARKS_DIR = "marks"
STEP, CHECKPOINT, COMPUTE = "step", "checkpoint", "compute"
# compute: a rank reached its step's collective (runtime/watch/straggler.py)
KINDS = (STEP, CHECKPOINT, COMPUTE)
READ_MAX = 4 << 20  # bytes of a marks or metrics file read, its end
HEAD_MAX = 64 << 10  # ... and of its beginning, when it is longer
ENTRIES_MAX = 4096  # entries of the checkpoint folder looked at


class Mark(NamedTuple):
    """One mark: its wall time, kind (step or checkpoint) and number (None: not given)."""

    t: float
    kind: str
    n: float | None


def marks_path(adir: str, name: str) -> str:
    """The file `$TREB_MARKS` names for one rank (the agent sets it)."""
    return os.path.join(adir, MARKS_DIR, name)


def _ends(path: str, read_max: int = READ_MAX) -> bytes:
    """A regular file's whole lines: all of it, or past READ_MAX bytes its first HEAD_MAX
    and last READ_MAX bytes (the attempt's first step; its last checkpoint and step),
    each without the line cut where it starts or stops; b"" when there is none."""
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
    """A finite float from a word or JSON value; None otherwise (bools are no numbers)."""
    if isinstance(word, bool):
        return None
    try:
        value = float(word)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def parse_marks(data: bytes) -> list[Mark]:
    """The marks of a marks file's bytes: lines `<time> <kind> [<n>]`; others skipped."""
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
    """The steps of a metrics file's bytes (watch/metric_reader.py: `{"t": .., "s": ..}`)."""
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
    """Where the first (`last`: the last) `lines` lines of `data` end (start)."""
    at = len(data) if last else 0
    for _ in range(lines):
        at = data.rfind(b"\n", 0, max(0, at - 1)) + 1 if last else data.find(b"\n", at) + 1
        if at <= 0:
            return 0 if last else len(data)
    return at


def _file_marks(data: bytes, points: bool, lines: int = LINES_MAX) -> list[Mark]:
    """A file's marks at the cost of its ends: its first lines/8 and last lines/2 lines
    (the first step, the last ones), and of the middle only the checkpoint lines (found by
    one regex scan, in C), the last lines/2 of them: a rank that marks a million
    checkpoints in a burst costs what `lines` marks do."""
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
    marked a step. At most ATTEMPT_READ_MAX bytes read and ATTEMPT_MARKS_MAX marks taken
    however many files a rank wrote (the controller reads them between attempts)."""

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
    """The checkpoint folder's entries as checkpoints at their mtime (a temporary or
    hidden one, starting with '.', is not one yet), in time order."""
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
    """The run's `TREB_CHECKPOINT_DIR` (the job's `checkpoint_dir`, else <run>/checkpoints)."""
    try:
        data = json.loads(_ends(os.path.join(run_dir, "job.json")) or b"null")
    except (ValueError, RecursionError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("checkpoint_dir"), str):
        return str(data["checkpoint_dir"])
    return os.path.join(run_dir, "checkpoints")


def progressed(run_dir: str, attempt: int, started: float) -> bool | None:
    """Did attempt `attempt` (started at wall time `started`) keep any work: a checkpoint
    past the run's last one before it (a marked checkpoint of a higher step, or an entry of
    the checkpoint folder written since it started)? None when the run has shown no
    checkpoint at all: then nothing says what progress is, and `retries` alone rule."""
    adir = os.path.join(run_dir, f"attempt-{attempt}")
    before: list[Mark] = []
    for a in range(attempt):
        before += [m for m in attempt_marks(os.path.join(run_dir, f"attempt-{a}"))
                   if m.kind == CHECKPOINT]  # fmt: skip
    mine = [m for m in attempt_marks(adir) if m.kind == CHECKPOINT]
    folder = folder_checkpoints(checkpoint_folder(run_dir))
    if not (before or mine or folder):
        return None
    best = max((m.n for m in before if m.n is not None), default=None)
    for m in mine:
        if m.n is None or best is None or m.n > best:
            return True
    return any(m.t >= started for m in folder)


# -- checkpoints announced by a log line ------------------------------------------------
# What common trainers print once they save (real lines: tests/fixtures/trainers/): the
# HuggingFace Trainer `Saving model checkpoint to .../checkpoint-30`, Lightning's
# ModelCheckpoint (verbose) `... saving model to '.../epoch=0-step=50.ckpt'`, Megatron-LM
# `successfully saved checkpoint from iteration 100 to ...`, DeepSpeed `[Torch] Checkpoint
# global_step10 is ready now!`, and a plain `checkpoint saved`. The spec's
# `checkpoint_pattern` replaces it ("" turns it off); its group `step`, if any, is the number.
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
    """A spec's pattern took its CPU budget on a line (SIGVTALRM interrupts the regex)."""


_ARMED = [False]  # a search runs under the timer: the signal interrupts it (one process)


def _ring(signum: int, frame: object) -> None:
    if _ARMED[0]:
        _ARMED[0] = False
        raise _Slow()


class LineCheckpoints:
    """The agent's on_line hook that turns a checkpoint line of a process's log into a
    checkpoint mark (marks/<name>.from-log), as if the rank had called
    `trebuchet.dist.mark("checkpoint", n)` when the line was read (at most a second late).

    A spec's own pattern is the spec author's code run on every line a rank prints: it
    sees a line's first LINE_SCAN bytes, and each search runs under a CPU timer (in the
    main thread: a catastrophic backtracking is interrupted); a pattern that took
    PATTERN_CPU_S on a line, or PATTERN_TOTAL_S in all, is turned off for the attempt,
    said once on stderr (the agent's log). The same checkpoint (number) said again within
    SAME_MARK_S is one mark: a rank printing the line every millisecond writes no more."""

    def __init__(self, adir: str, pattern: str) -> None:
        self.adir = adir
        self.rx: re.Pattern[bytes] | None = re.compile(pattern.encode())
        self.default = pattern == DEFAULT_CHECKPOINT_PATTERN
        self.made = False
        self.spent = 0.0  # CPU seconds the spec's pattern took
        self.last: dict[str, tuple[float | None, float]] = {}  # name: (n, time) last marked

    def _search(self, line: bytes) -> re.Match[bytes] | None:
        """The pattern's match, within the budget (see the class's docstring)."""
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
        """A CPU timer that interrupts the regex, where one can be had: the main thread,
        SIGVTALRM not someone else's, its timer not running."""
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
        found = _CHECKPOINT_N.search(line) if step is None else None
        n = _number(step.decode("ascii", "replace")) if step is not None else None
        if found is not None:
            n = _number(found[1].decode())
        wall = time.time()
        said = self.last.get(name)
        if said is not None and said[0] == n and 0 <= wall - said[1] < SAME_MARK_S:
            return
        self.last[name] = (n, wall)
        from ..rundir.records import writable_fd

        text = f"{wall:.6f} {CHECKPOINT}" + ("" if n is None else f" {n:g}") + "\n"
        try:
            if not self.made:
                os.makedirs(os.path.join(self.adir, MARKS_DIR), mode=0o700, exist_ok=True)
                self.made = True
            fd = writable_fd(marks_path(self.adir, name + LINE_MARKS))
        except OSError:
            return
        try:
            os.write(fd, text.encode())
        except OSError:
            pass
        finally:
            os.close(fd)


def pattern_risk(pattern: str) -> str | None:
    """Why a regular expression may backtrack catastrophically on a line, else None: a
    repeat around an unbounded repeat (`(a+)+`, `(\\w+\\s?)*`, `(.*a){12}`: exponential or
    a high power of the line's length), an unbounded repeat around alternatives (`(x|x)*`),
    a backreference. The CPU budget (LineCheckpoints) bounds the rest; this says it at
    `treb check` time, with the field's name."""
    try:
        import re._parser as sre  # type: ignore[import-not-found,unused-ignore]
        from re._constants import MAXREPEAT  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # Python 3.10
        import sre_parse as sre  # type: ignore[no-redef,unused-ignore]
        from sre_constants import MAXREPEAT  # type: ignore[no-redef,unused-ignore]
    try:
        tree = sre.parse(pattern.encode())
    except (re.error, ValueError, RecursionError, OverflowError):
        return None  # the compile says what is wrong

    def walk(items: object, within: int) -> str | None:
        """`within`: 0 outside repeats, 1 inside a bounded one, 2 an unbounded one."""
        for op, av in items:  # type: ignore[attr-defined]
            name, found = str(op), None
            if name in ("GROUPREF", "GROUPREF_EXISTS"):
                return "a backreference"
            if name in ("MAX_REPEAT", "MIN_REPEAT"):
                high, body = av[1], av[2]
                if high == MAXREPEAT and within:
                    return "an unbounded repeat inside a repeat"
                found = walk(body, max(within, 2 if high == MAXREPEAT else int(high > 1)))
            elif name == "BRANCH":
                if within == 2:
                    return "alternatives inside an unbounded repeat"
                found = next((w for b in av[1] if (w := walk(b, within))), None)
            elif name in ("SUBPATTERN", "ASSERT", "ASSERT_NOT"):
                found = walk(av[-1], within)
            elif name == "ATOMIC_GROUP":
                found = walk(av, within)
            if found:
                return found
        return None

    return walk(tree, 0)


def checkpoint_lines(adir: str, config: dict[str, object]) -> LineCheckpoints | None:
    """The hook for the run's metrics.json `checkpoint_pattern` (absent: the default; "":
    none); None when off or not a regular expression."""
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
    """One on_line of several (those not None); None when there is none."""
    found = [h for h in hooks if h is not None]
    if len(found) <= 1:
        return found[0] if found else None

    def every(name: str, line: bytes) -> None:
        for h in found:
            h(name, line)

    return every
