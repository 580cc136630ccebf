"""A run's progress and ETA, from what its first rank already prints: a tqdm bar,
`step 120/1000`, the HuggingFace Trainer's start lines and dicts, or the spec's
`metrics.progress` regex (docs/metrics.md).

The run's progress is the training loop's bar, not whichever bar drew last: a bar of one
item is none, a bar named for another loop (OTHER_LOOPS) is none, and once the Trainer's
bar runs a bar of another total is evaluation's. Only the newest lines of a reader step
are parsed, each after a cheap marker test: a rank printing progress on every line costs
one parse a second.

The rate is measured from the first step this attempt made on (a resumed bar jumps to its
checkpoint's step: tqdm's own rate counts that jump). `moved` and `gap_s` let a reader
call the run stalled instead of counting its ETA down to 0. Total: a line yields a
reading or nothing, never an exception.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any, Callable, Dict, Optional

from ..rundir.records import read_json, write_json
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
# A count is the whole number: `= 1e999` is no 1, `= 1.5` no 1 (_count: finite, not 0)
_COUNT = rb"\s*=\s*(\d[\d,]*)(?![\w.])"
_NUMBER_AFTER_EQ = rb"=\s*(\d[\d,]*)(?![\w.])"
_HF_TOTAL = re.compile(rb"Total optimization steps" + _COUNT)
_HF_EPOCHS = re.compile(rb"Num Epochs" + _COUNT)
_HF_PER_EPOCH = re.compile(rb"Num update steps per epoch" + _COUNT)  # transformers 5
_HF_EXAMPLES = re.compile(rb"Num examples" + _COUNT)  # and the next, 4's per epoch
_HF_BATCH = re.compile(rb"Total train batch size[^=]*" + _NUMBER_AFTER_EQ)  # [^=]* ends at =
# `45%|####  ` before a bar's `| n/total` (no leading \s*: tried from each space of a long
# run, it cost the run's square; the name is stripped after)
_PCT = re.compile(rb"\d{1,3}%\s*\|[^|]*$")
_DIGITS = re.compile(rb"\d+")
# Bars of the loops beside training (Lightning's sanity check, validation, test, predict;
# evaluation): never the run's progress.
OTHER_LOOPS = re.compile(rb"(?i)\b(?:sanity|validat|test|predict|eval)")
_SCALE = {b"": 1.0, b"k": 1e3, b"M": 1e6, b"G": 1e9, b"T": 1e12, b"P": 1e15}

Reading = Dict[str, Optional[float]]  # step, total, rate (None: unknown)


def _scaled(num: bytes, suffix: bytes) -> float:
    return float(num) * _SCALE.get(suffix, 1.0)


def _seconds(clock: bytes) -> float | None:
    try:
        parts = [int(p) for p in clock.split(b":")]
    except ValueError:
        return None
    total = 0
    for p in parts:
        total = total * 60 + p
    return float(total)


def _count(m: re.Match[bytes]) -> float | None:
    """A Trainer's count (`1,000`): None when 0 or past what a float holds."""
    v = float(m[1].replace(b",", b""))
    return v if v and _sane(v) else None


class Parser:
    """Keeps what the HuggingFace Trainer said at its start: its dicts need it."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = re.compile(pattern.encode()) if pattern else None
        self.hf_total: float | None = None  # Total optimization steps
        self.hf_epochs: float | None = None  # Num Epochs
        self.hf_per_epoch: float | None = None  # steps an epoch has
        self.hf_examples: float | None = None  # Num examples (4.x: / batch = per epoch)
        self.main: tuple[bytes, float] | None = None  # the main bar: (its name, total)

    def parse(self, line: bytes) -> tuple[Reading | None, float | None]:
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
        """The steps an epoch has: given by transformers 5; examples over the batch in 4."""
        for rx, attr in (
            (_HF_TOTAL, "hf_total"),
            (_HF_EPOCHS, "hf_epochs"),
            (_HF_PER_EPOCH, "hf_per_epoch"),
            (_HF_EXAMPLES, "hf_examples"),
        ):
            m = rx.search(head)
            if m:
                setattr(self, attr, _count(m))
        m = _HF_BATCH.search(head)
        batch = _count(m) if m else None
        if batch and self.hf_examples and self.hf_per_epoch is None:
            self.hf_per_epoch = -(-self.hf_examples // batch)

    def _is_main(self, before: bytes, m: re.Match[bytes]) -> bool:
        total = _scaled(m[3], m[4])
        if total <= 1 or (
            self.main is not None and self.main[1] == self.hf_total != total
        ):  # another loop's, once the Trainer's bar runs: a printed total cannot stop it
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


def parser(pattern: str | None) -> Parser:
    """A spec's pattern that does not compile is none: never an agent's end."""
    try:
        return Parser(pattern)
    except (re.error, TypeError, ValueError, RecursionError, OverflowError):
        return Parser()


def figures(reading: Reading, rate: float | None, left: float | None) -> dict[str, Any]:
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


COUNT_MAX = float(1 << 53)  # past it a float counts no step exactly: no figure, a long cell


def _sane(v: Any) -> bool:
    """None, or a number a float counts exactly (a 290-digit total is finite, and no progress)."""
    if v is None:
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < COUNT_MAX


def _plain(v: float | None) -> float | int | None:
    return int(v) if v is not None and float(v).is_integer() else v


class Eta:
    def __init__(self, adir: str, pattern: str | None = None) -> None:
        self.run_dir = os.path.dirname(adir.rstrip("/"))
        base = os.path.basename(adir.rstrip("/"))
        self.attempt = int(base[8:]) if base[8:].isdigit() else 0
        self.parser = parser(pattern)
        self.reading: Reading | None = None
        self.left: float | None = None
        self.samples: list[tuple[float, float]] = []  # (wall, step) over the window
        self.first: float | None = None  # the step first read this attempt (resume: a jump)
        self.moves: list[float] = []  # when the step advanced (the last ones)
        self.since: float | None = None  # the first reading's time: `moved` before an advance
        self.lines: list[bytes] = []  # the first rank's lines of this reader step

    def __call__(self, name: str, line: bytes) -> None:
        """A Trainer's `steps = N` is read at once (a later dict needs it); the rest in flush()."""
        if name not in FIRST:
            return
        if b" = " in line:
            self.parser.parse(line)
        self.lines.append(line)

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        for line in reversed(lines):
            reading, left = self.parser.parse(line)
            if reading is not None:
                self.reading, self.left = reading, left
                break
        else:
            return
        now = time.time()
        if self.since is None:
            self.since = now
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
                  "moved": round(self.moves[-1] if self.moves else self.since, 3),
                  "gap_s": None if gap is None else round(gap, 3),
                  **figures(self.reading, rate, left)}  # fmt: skip
        try:
            write_json(os.path.join(self.run_dir, FILE), record, durable=False)
        except OSError:
            return

    def _sample(self, now: float, step: float | None) -> None:
        """From the first advance on: a resumed bar's jump to its checkpoint is no speed."""
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
    if then is None:
        return first

    def both(name: str, line: bytes) -> None:
        first(name, line)
        then(name, line)

    return both


def hook(adir: str, config: dict[str, Any] | None) -> Eta:
    pattern = (config or {}).get("progress")
    return Eta(adir, pattern if isinstance(pattern, str) else None)


def read(run_dir: str, attempt: int | None = None) -> dict[str, Any] | None:
    data = read_json(os.path.join(run_dir, FILE), 1 << 16)
    if not isinstance(data, dict) or (attempt is not None and data.get("attempt") != attempt):
        return None
    return _aged(_checked(data))


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    """A rank can write this file too: figures that are no sane numbers read as None."""
    out = dict(data)
    for k in ("step", "total", "fraction", "rate", "eta_s", "t", "moved", "gap_s"):
        v = out.get(k)
        out[k] = v if _sane(v) and not (k == "fraction" and v is not None and v > 1) else None
    return out


def _aged(data: dict[str, Any]) -> dict[str, Any]:
    """The ETA counted down to now, or `stalled_s` instead: a hung run does not reach 0 s."""
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
    """For engines whose agents' records stay on their nodes: the logs come back."""
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
    reader = parser(pattern)
    last: tuple[Reading, float | None] | None = None
    for line in data.replace(b"\r", b"\n").split(b"\n"):
        reading, left = reader.parse(line)
        if reading is not None:
            last = (reading, left)
    if last is None:
        return None
    return _aged({"t": mtime, **figures(last[0], last[0].get("rate"), last[1])})
