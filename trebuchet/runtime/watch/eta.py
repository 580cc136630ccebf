"""A run's progress and ETA, from what its first rank already prints.

The agent's one log reader (progress.py) hands every line to its hook; `Eta` is the part
of that hook that looks at the first rank's lines only (rank-0, or node-0 where the
launcher starts one process per node) and finds how far the run is:
- a tqdm bar: `45%|####  | 450/1000 [00:10<00:12, 43.2it/s]` (each `\\r` state is a line);
- `step 120/1000` (also `iter`, `iteration`, `batch`; `of` for `/`; `epoch 3/10` when no
  step is given);
- the HuggingFace Trainer: `Total optimization steps = 1,000`, `Num Epochs = 3` and the
  steps an epoch has (`Num update steps per epoch = 512` in transformers 5; 4 gives `Num
  examples` and `Total train batch size`) at its start (with log_level info), then its dicts
  `{'loss': ..., 'epoch': 0.5}` (5 prints `'epoch': '0.5'`): step = epoch x steps an epoch;
- the spec's `metrics.progress`, a regex with the named groups `step` and `total`.
The run's progress is the training loop's bar, not whichever bar drew last: a bar of one
item (a checkpoint's `Writing model shards: 1/1`) is none, a bar whose total is not the
Trainer's `Total optimization steps` is another loop's (evaluation), a bar named for such a
loop (`Sanity Checking`, `Validation`, `Testing`, ...: `OTHER_LOOPS`) is none, and otherwise
the main bar is the one with the largest total seen (Lightning's `Epoch N` bars are one).
Each parser looks for a cheap marker (`/`, `epoch`, `steps =`) before any regex, and only
the newest lines of a reader step are parsed, back to the first that reads: a rank that
prints progress on every line costs one parse a second.

The latest reading goes to `<run dir>/progress.json` (temp file and rename, once per
reader step at most, only when it changed), where every engine's controller and the CLI
read it: `{attempt, step, total, fraction, rate (steps/s), eta_s, t, moved, gap_s}`. The rate
is the steps over the last `WINDOW_S` seconds of readings, from the first step this attempt
made on (a resumed bar jumps to its checkpoint's step at once: tqdm's own rate counts that
jump, and stays high); tqdm's own rate and time left only until there are two such readings.
`moved` is when the step last advanced and `gap_s` the usual time between advances: a
reader finds the run stalled (`stalled_s`, no ETA) when no step came for `STALL_GAPS` such
gaps and at least `STALL_MIN_S` seconds, instead of counting the ETA down to 0.
`from_log_tail` reads the same from the tail of a log, for engines whose agents' files stay
on their nodes (the logs come back; this record does not).

Total: a line yields a reading or nothing, never an exception.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable, Dict, Optional

from ..rundir.records import write_json
from ..rundir.regular import open_fd

FILE = "progress.json"
WINDOW_S = 60.0
STALL_MIN_S = 15.0  # no step for this long at least before a run is called stalled
STALL_GAPS = 10.0  # ... and for this many of its usual gaps between steps
SCAN = 2048  # bytes of a line the built-in parsers look at (a bar, a step, a dict's end)
TAIL = 64 << 10  # bytes of a log's end that from_log_tail reads
FIRST = ("rank-0", "node-0")

_NUM = rb"\d+(?:\.\d+)?"
_SCALED = rb"(\d+(?:\.\d+)?)([kMGTP]?)"
_TQDM = re.compile(
    rb"\|\s*" + _SCALED + rb"/" + _SCALED + rb"\s*\[(?P<el>[\d:]+)<(?P<left>[\d:]+|\?)"
    rb"(?:,\s*(?P<rate>" + _NUM + rb")\s*(?P<unit>[^\],\s]*))?"
)
_STEP = re.compile(
    rb"(?i)\b(step|iter|iteration|batch|epoch)\b\s*[:=#]?\s*(\d+)\s*(?:/|\bof\b)\s*(\d+)"
)
_HF_KEY = re.compile(  # transformers 5 quotes its values: 'epoch': '0.5'
    rb"""['"](epoch|step|global_step|max_steps|num_train_epochs)['"]\s*:\s*['"]?(""" + _NUM + rb")"
)
_HF_TOTAL = re.compile(rb"Total optimization steps\s*=\s*([\d,]+)")
_HF_EPOCHS = re.compile(rb"Num Epochs\s*=\s*([\d,]+)")
_HF_PER_EPOCH = re.compile(rb"Num update steps per epoch\s*=\s*([\d,]+)")  # transformers 5
_HF_EXAMPLES = re.compile(rb"Num examples\s*=\s*([\d,]+)")  # and the next, 4's per epoch
_HF_BATCH = re.compile(rb"Total train batch size[^=]*=\s*([\d,]+)")
_PCT = re.compile(rb"\s*\d{1,3}%\s*\|[^|]*$")  # `: 45%|####  ` before a bar's `| n/total`
_DIGITS = re.compile(rb"\d+")
# Bars of the loops beside training (Lightning's sanity check, validation, test, predict;
# evaluation): never the run's progress.
OTHER_LOOPS = re.compile(rb"(?i)\b(?:sanity|validat|test|predict|eval)")
_SCALE = {b"": 1.0, b"k": 1e3, b"M": 1e6, b"G": 1e9, b"T": 1e12, b"P": 1e15}

Reading = Dict[str, Optional[float]]  # step, total, rate (None: unknown)


def _scaled(num: bytes, suffix: bytes) -> float:
    return float(num) * _SCALE.get(suffix, 1.0)


def _seconds(clock: bytes) -> float | None:
    """tqdm's `01:02:03` / `00:12` as seconds; None for `?`."""
    try:
        parts = [int(p) for p in clock.split(b":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return float(total)


class Parser:
    """One rank's lines -> readings; keeps what the HuggingFace Trainer said at its start."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = re.compile(pattern.encode()) if pattern else None
        self.hf_total: float | None = None  # Total optimization steps
        self.hf_epochs: float | None = None  # Num Epochs
        self.hf_per_epoch: float | None = None  # steps an epoch has
        self.hf_examples: float | None = None  # Num examples (4.x: / batch = per epoch)
        self.main: tuple[bytes, float] | None = None  # the main bar: (its name, total)

    def parse(self, line: bytes) -> tuple[Reading | None, float | None]:
        """(reading or None, seconds left when the line says it: tqdm's)."""
        try:
            reading, left = self._parse(line)
        except (ValueError, OverflowError, IndexError, ZeroDivisionError):
            return None, None
        if reading is not None and not all(_sane(v) for v in reading.values()):
            return None, None  # `step 1e999/..`, a pattern's `nan`: no reading
        return reading, left if _sane(left) else None

    def _parse(self, line: bytes) -> tuple[Reading | None, float | None]:
        if self.pattern is not None:
            m = self.pattern.search(line)
            if m:
                got = m.groupdict()
                if got.get("step") is not None:
                    total = got.get("total")
                    total_ = float(total) if total else None
                    return {"step": float(got["step"]), "total": total_, "rate": None}, None
        head = line[-SCAN:]
        if b"/" in head and b"[" in head:
            m = _TQDM.search(head)
            if m:
                return self._tqdm(m) if self._is_main(head[: m.start()], m) else (None, None)
        if b"/" in head or b" of " in head:
            found = _STEP.findall(head)
            if found:  # a step before an epoch: `epoch 2/5 step 120/1000` reads the step
                kind, step_, total_ = next((f for f in found if f[0].lower() != b"epoch"),
                                           found[0])  # fmt: skip
                return {"step": float(step_), "total": float(total_), "rate": None}, None
        if b" = " in head and (b"steps =" in head or b"Epoch" in head or b"Num " in head
                               or b"batch size" in head):  # fmt: skip
            self._hf_start(head)
            return None, None
        if head.endswith(b"}") and (b"epoch" in head or b"step" in head):
            return self._hf(head), None
        return None, None

    def _hf_start(self, head: bytes) -> None:
        """What the Trainer says at its start: the steps in all, the epochs, the steps an
        epoch has (given by 5; examples over the total batch in 4)."""
        for rx, attr in (
            (_HF_TOTAL, "hf_total"),
            (_HF_EPOCHS, "hf_epochs"),
            (_HF_PER_EPOCH, "hf_per_epoch"),
            (_HF_EXAMPLES, "hf_examples"),
        ):
            m = rx.search(head)
            if m:
                setattr(self, attr, float(m[1].replace(b",", b"")) or None)
        m = _HF_BATCH.search(head)
        if m and self.hf_examples and self.hf_per_epoch is None:
            batch = float(m[1].replace(b",", b""))
            self.hf_per_epoch = -(-self.hf_examples // batch) if batch else None

    def _is_main(self, before: bytes, m: re.Match[bytes]) -> bool:
        """Whether a bar is the training loop's (module docstring): it becomes the main one
        when it is the first, or longer than the main one."""
        total = _scaled(m[3], m[4])
        if total <= 1 or (self.hf_total and total != self.hf_total):
            return False
        name = _DIGITS.sub(b"#", _PCT.sub(b"", before).strip()[-80:])
        if OTHER_LOOPS.search(name):
            return False
        if self.main is None or name == self.main[0] or total > self.main[1]:
            self.main = (name, total)
            return True
        return False

    @staticmethod
    def _tqdm(m: re.Match[bytes]) -> tuple[Reading, float | None]:
        """A bar's n/total, its rate (it/s, s/it, scaled units) and its own time left."""
        step, total = _scaled(m[1], m[2]), _scaled(m[3], m[4])
        rate = None
        if m["rate"] is not None:
            r = float(m["rate"])
            unit = m["unit"] or b""
            if unit.startswith(b"s/") and r > 0:
                rate = 1.0 / r
            elif unit.endswith(b"/s"):
                rate = r * _SCALE.get(unit[:1], 1.0) if unit[:1] in b"kMGTP" else r
        return {"step": step, "total": total, "rate": rate}, _seconds(m["left"])

    def _hf(self, head: bytes) -> Reading | None:
        """A Trainer dict: its step and max_steps, else its epoch against Num Epochs."""
        keys = {k.decode(): float(v) for k, v in _HF_KEY.findall(head)}
        total = keys.get("max_steps") or self.hf_total
        step = keys.get("global_step", keys.get("step"))
        if step is not None and total:
            return {"step": step, "total": total, "rate": None}
        epoch = keys.get("epoch")
        if epoch is not None and self.hf_per_epoch and total:  # max_steps may end mid-epoch
            return {"step": min(total, round(epoch * self.hf_per_epoch)), "total": total,
                    "rate": None}  # fmt: skip
        epochs = keys.get("num_train_epochs") or self.hf_epochs
        if epoch is None or not epochs:
            return None
        if total:  # the steps, from the fraction of the epochs done
            return {"step": round(epoch / epochs * total), "total": total, "rate": None}
        return {"step": epoch, "total": epochs, "rate": None}


def figures(reading: Reading, rate: float | None, left: float | None) -> dict[str, Any]:
    """The record's numbers: fraction, rate and eta_s where they can be known."""
    step, total = reading["step"], reading["total"]
    fraction = None
    if step is not None and total and total > 0:
        fraction = max(0.0, min(1.0, step / total))
    eta = left
    if eta is None and rate and rate > 0 and step is not None and total:
        try:
            eta = max(0.0, (total - step) / rate)
        except OverflowError:
            eta = None
    rate, eta = (rate if _sane(rate) else None), (eta if _sane(eta) else None)
    return {
        "step": _plain(step), "total": _plain(total),
        "fraction": None if fraction is None else round(fraction, 4),
        "rate": None if rate is None else round(rate, 4),
        "eta_s": None if eta is None else round(eta, 1),
    }  # fmt: skip


def _sane(v: Any) -> bool:
    """None, or a finite non-negative number (a step, total, rate or seconds left)."""
    if v is None:
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e300


def _plain(v: float | None) -> float | int | None:
    return int(v) if v is not None and float(v).is_integer() else v


class Eta:
    """The reader's hook for the first rank's lines; `flush()` after each reader step."""

    def __init__(self, adir: str, pattern: str | None = None) -> None:
        self.run_dir = os.path.dirname(adir.rstrip("/"))
        base = os.path.basename(adir.rstrip("/"))
        self.attempt = int(base[8:]) if base[8:].isdigit() else 0
        try:
            self.parser = Parser(pattern)
        except (re.error, TypeError, ValueError, RecursionError, OverflowError):
            self.parser = Parser()
        self.reading: Reading | None = None
        self.left: float | None = None
        self.samples: list[tuple[float, float]] = []  # (wall, step) over the window
        self.first: float | None = None  # the step first read this attempt (resume: a jump)
        self.moves: list[float] = []  # when the step advanced (the last ones)
        self.lines: list[bytes] = []  # the first rank's lines of this reader step

    def __call__(self, name: str, line: bytes) -> None:
        """Keep the line for flush(), which parses from the newest back to the first that
        reads (one parse a step when each line is progress); a Trainer's `steps = N` /
        `Epochs = N` is read at once, as a later dict needs it."""
        if name not in FIRST:
            return
        if b" = " in line:
            self.parser.parse(line)
        self.lines.append(line)

    def flush(self) -> None:
        """Record the latest reading, when the step's lines hold one (once per reader step
        at most: the caller's)."""
        lines, self.lines = self.lines, []
        for line in reversed(lines):
            reading, left = self.parser.parse(line)
            if reading is not None:
                self.reading, self.left = reading, left
                break
        else:
            return
        now = time.time()
        self._sample(now, self.reading["step"])
        rate = None
        if len(self.samples) >= 2:
            (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
            rate = (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None
        left = self.left
        if rate is None:  # none measured yet: the bar's own figures
            rate = self.reading.get("rate")
        else:
            left = None  # (total - step) / the measured rate
        gap = (
            (self.moves[-1] - self.moves[0]) / (len(self.moves) - 1)
            if len(self.moves) > 1
            else None
        )
        record = {"attempt": self.attempt, "t": round(now, 3),
                  "moved": round(self.moves[-1], 3) if self.moves else round(now, 3),
                  "gap_s": None if gap is None else round(gap, 3),
                  **figures(self.reading, rate, left)}  # fmt: skip
        try:
            write_json(os.path.join(self.run_dir, FILE), record, durable=False)
        except OSError:
            return

    def _sample(self, now: float, step: float | None) -> None:
        """Keep (now, step) for the rate: from the first advance on (a resumed bar's jump
        to its checkpoint is no speed), a bar that starts again (an epoch's) anew."""
        if step is None:
            return
        last = self.samples[-1][1] if self.samples else self.first
        if self.first is None:
            self.first = step
        elif last is not None and step > last:
            self.moves = [*self.moves[-31:], now]
            if len(self.moves) == 1:  # the first advance: measured from here
                self.samples = []
        if self.samples and step < self.samples[-1][1]:  # a new bar (an epoch's)
            self.samples = []
        self.samples.append((now, step))
        self.samples = [s for s in self.samples if now - s[0] <= WINDOW_S][-256:]


def chain(first: Eta, then: Callable[[str, bytes], None] | None) -> Callable[[str, bytes], None]:
    """One on_line for the reader: the ETA's, then the metrics' (None: the ETA's alone)."""
    if then is None:
        return first

    def both(name: str, line: bytes) -> None:
        first(name, line)
        then(name, line)

    return both


def hook(adir: str, config: dict[str, Any] | None) -> Eta:
    """The agent's Eta for an attempt directory (`config`: the run's metrics.json)."""
    pattern = (config or {}).get("progress")
    return Eta(adir, pattern if isinstance(pattern, str) else None)


def read(run_dir: str, attempt: int | None = None) -> dict[str, Any] | None:
    """The run's progress record (of `attempt` when given), its ETA counted down to now;
    None when there is none."""
    try:
        fd = open_fd(os.path.join(run_dir, FILE))
    except OSError:
        return None
    try:
        data = json.loads(os.read(fd, 1 << 16))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or (attempt is not None and data.get("attempt") != attempt):
        return None
    return _aged(_checked(data))


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """The record's figures that are finite non-negative numbers (a fraction at most 1);
    the others None: a rank can write this file too, and the views format these."""
    out = dict(data)
    for k in ("step", "total", "fraction", "rate", "eta_s", "t", "moved", "gap_s"):
        v = out.get(k)
        out[k] = v if _sane(v) and not (k == "fraction" and v is not None and v > 1) else None
    return out


def _aged(data: dict[str, Any]) -> dict[str, Any]:
    """The ETA counted down to now; none, and `stalled_s` instead, once no step came for
    STALL_GAPS usual gaps (at least STALL_MIN_S): a hung run does not reach 0 s."""
    now = time.time()
    eta, t = data.get("eta_s"), data.get("t")
    moved, gap = data.get("moved"), data.get("gap_s") or 0.0
    if moved is None:  # a record without it (older, or a log's tail): its reading's time
        moved = t
    data["stalled_s"] = None
    if isinstance(moved, (int, float)) and now - moved > max(STALL_MIN_S, STALL_GAPS * gap):
        data["stalled_s"], data["eta_s"] = round(now - moved), None
    elif isinstance(eta, (int, float)) and isinstance(t, (int, float)):
        data["eta_s"] = round(max(0.0, eta - max(0.0, now - t)), 1)
    return data


def from_log_tail(path: str, pattern: str | None = None) -> dict[str, Any] | None:
    """The last reading in the last `TAIL` bytes of a log (an engine whose agents' records
    stay on their nodes); the rate only where the line gives it (a tqdm bar)."""
    try:
        fd = open_fd(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, TAIL, max(0, size - TAIL))
        mtime = os.fstat(fd).st_mtime
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        parser = Parser(pattern)
    except (re.error, TypeError, ValueError, RecursionError, OverflowError):
        parser = Parser()
    last: tuple[Reading, float | None] | None = None
    for line in data.replace(b"\r", b"\n").split(b"\n"):
        reading, left = parser.parse(line)
        if reading is not None:
            last = (reading, left)
    if last is None:
        return None
    return _aged({"t": mtime, **figures(last[0], last[0].get("rate"), last[1])})
