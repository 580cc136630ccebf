"""Metrics from rank log lines, read on the node by the agent's one log reader
(docs/metrics.md); the points go to `attempt-<n>/metrics/<name>.jsonl`, which the
submitting side ingests: SQLite is never written from a node.

A line is read as, in order: `performance: <number> <metric>`, a JSON object, the
HuggingFace Trainer's dict repr (ast.literal_eval on at most LITERAL_MAX bytes, never
eval), the spec's `patterns`, a tqdm or rich bar's metrics, `key=value` pairs after the
spec's `prefix`. A name is kept as a terminal shows it (`shown`), so no name can break
SQLite, a view or a terminal.

Total: whatever a rank prints, a line yields points or nothing, never an exception (the
agent's death would end the run); a number that is no finite float is dropped and
counted (`"x": {"nonfinite": n}`). Bounded: MAX_NAMES names a process, and a file past
SOFT_MAX thinned, past HARD_MAX stopped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from typing import Any, Dict, Iterable, Sequence

from ..rundir.records import read_json, writable_fd
from .display_lines import shown
from .paths import COUNTED, MAX_NAMES, METRICS_CONFIG, metrics_config

NUMBER = rb"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
PERF = re.compile(
    rb"performance:\s*(?P<value>" + NUMBER + rb")\s*(?:/\s*[A-Za-z%][\w%]*)?\s*,?\s*"
    rb"(?P<metric>[A-Za-z_%][\w./%-]*)"
)
# A key starts a word and is at most NAME_MAX long: tried from each letter of a long word,
# to its end, it cost the word's square (a 16 KiB word: seconds).
_PAIR = re.compile(
    rb"(?<![\w./-])(?P<key>[A-Za-z_][\w./-]{0,99})\s*[=:]\s*(?P<value>" + NUMBER + rb")(?![\w.])"
)
_ANSI = re.compile(rb"\^\[\[[0-9;]*[A-Za-z]")  # colours, as lines.inert shows ESC
_NOT_BRACKET = re.compile(rb"[^\[\]{}()]+")
# The Trainer's repr of a diverged value (`'loss': nan`): no literal; read as one that is
# not finite (dropped and counted), so the line's other values stay.
_BARE = re.compile(r"(?<=[:,\[(]\s)(-?)(?:nan|inf)(?=\s*[,}\])])")
# An integer longer than this is no finite float (10**309 is not): read as inf, dropped and
# counted, never handed to int() (Python refuses 4,300 digits: the line would be lost).
INT_DIGITS = 310
_LONG_INT = re.compile(rf"(?<![\w.])\d{{{INT_DIGITS + 1},}}(?![\w.])")
STEP_KEYS = ("step", "global_step", "iteration", "iter")
EPOCH_KEY = "epoch"  # the step when a dict has no step key, kept as a value too
_NUMERIC = re.compile(NUMBER.decode() + r"|[+-]?(?:nan|inf|infinity)", re.I)
_PREFIX_STEP = re.compile(rb"(?i)\b(?:step|epoch|iter|iteration)\b\s*[:=#]?\s*(\d{1,15})\b")
# A bar's rate (`3.2it/s`, `1.5s/it`, `12.0 samples/s`): its metrics follow it. It starts
# where a run of digits does: tried from each digit of a long run, it cost the run's square.
_RATE = re.compile(rb"(?<![\d.])\d[\d.]*\s*(?:[kMG]?it/s|s/it|\?it/s)")
_BAR_N = re.compile(rb"(\d{1,15})/(\d{1,15})(?=[\s\[|])")
_BAR_EPOCH = re.compile(rb"\bEpoch (\d{1,15})\b")
_KEY = rb"([A-Za-z_][\w./-]{0,99})"
_BAR_ITEM = re.compile(rb"\s*" + _KEY + rb"=(" + NUMBER + rb")\s*")
_RICH_ITEM = re.compile(_KEY + rb":\s*(" + NUMBER + rb")(?=\s|$)")
_RICH_ITEMS = re.compile(rb"(?:\s+" + _KEY + rb":\s*" + NUMBER + rb")+\s*")
BAR_SKIP = ("v_num",)  # Lightning's bar: the logger's version, not a metric
LITERAL_MAX = 16 << 10
SCAN_BAR = 2048  # bytes of a line's end a bar's metrics are looked for in
DEPTH_MAX = 32  # nesting of a `{...}` decoded at most (json and ast recurse per level)
NAME_MAX = 100
METRICS_DIR = "metrics"
SOFT_MAX = 64 << 20
HARD_MAX = 256 << 20
THIN_S = 10.0

Values = Dict[str, float]


class Config:
    def __init__(
        self,
        ranks: Any = None,
        prefix: str | None = None,
        patterns: list[str] | None = None,
        enabled: bool = True,
    ) -> None:
        self.ranks = "all" if ranks == "all" else set(ranks if ranks is not None else [0])
        self.enabled = enabled and self.ranks != set()
        self.prefix = prefix.encode() if prefix else None
        self.patterns = [re.compile(p.encode()) for p in patterns or []]

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Config:
        data = data or {}
        return cls(
            data.get("ranks"), data.get("prefix"), data.get("patterns"), data.get("enabled", True)
        )

    def wants(self, name: str) -> bool:
        if not self.enabled:
            return False
        kind, _, num = name.partition("-")
        if kind not in ("rank", "node") or not num.isdigit():
            return False
        return self.ranks == "all" or int(num) in self.ranks


def _number(v: Any) -> float | None:
    """inf when it does not fit (dropped later); a string that holds just a number too
    (transformers 5's `'loss': '2.1'`)."""
    if isinstance(v, str):
        if len(v) > 400 or not _NUMERIC.fullmatch(v.strip()):
            return None
        return float(v.strip())
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an int of hundreds of digits
        return math.inf if v > 0 else -math.inf


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _too_deep(part: bytes) -> bool:
    """json and ast recurse; brackets in strings count too, so one linear pass decides."""
    if part.count(b"{") + part.count(b"[") + part.count(b"(") <= DEPTH_MAX:
        return False
    depth = 0
    for c in _NOT_BRACKET.sub(b"", part):
        depth += 1 if c in b"[{(" else -1
        if depth > DEPTH_MAX:
            return True
    return False


def _from_mapping(d: Any) -> tuple[float | None, Values]:
    if not isinstance(d, dict):
        return None, {}
    found = ((k, _number(v)) for k, v in d.items())
    step, values = _split(
        (shown(k), f)  # a JSON key may hold ESC, NUL or a lone surrogate
        for k, f in found
        if f is not None and isinstance(k, str) and k and len(k) <= NAME_MAX
    )
    if step is None and EPOCH_KEY in values:
        step = values[EPOCH_KEY]
    return step, values


def _dict_part(line: bytes) -> bytes | None:
    if not line.endswith(b"}"):
        return None
    start = line.find(b"{")
    return line[start:] if start >= 0 else None


def parse(line: bytes, config: Config | None = None) -> tuple[float | None, Values]:
    step, values, _ = read(line, config)
    return step, values


def read(line: bytes, config: Config | None = None) -> tuple[float | None, Values, int]:
    step, raw = _parse(line, config)
    values = {k: v for k, v in raw.items() if math.isfinite(v)}
    return _finite(step), values, len(raw) - len(values)


def _parse(line: bytes, config: Config | None) -> tuple[float | None, Values]:
    if b"^[" in line:
        line = _ANSI.sub(b"", line)
    line = line.strip()
    if b"performance:" in line:
        m = PERF.search(line)
        if m:
            return None, {m["metric"].decode(errors="replace")[:NAME_MAX]: float(m["value"])}
    part = _dict_part(line)
    if part is not None and len(part) <= LITERAL_MAX and not _too_deep(part):
        step, values = _decoded(part)
        if values:
            if step is None:  # `epoch 3: {...}`: the step before the dict
                found = _PREFIX_STEP.findall(line[: len(line) - len(part)][-200:])
                step = float(found[-1]) if found else None
            return step, values
    if config is not None:
        for rx in config.patterns:
            m = rx.search(line)
            if m:
                step, values = _groups(m)
                if values:
                    return step, values
    if b"/s" in line or b"s/it" in line:
        step, values = _bar(line)
        if values:
            return step, values
    if config is not None and config.prefix is not None:
        at = line.find(config.prefix)
        if at >= 0:
            return _pairs(line[at + len(config.prefix) :])
    return None, {}


def _int(text: str) -> float:
    if len(text.lstrip("-")) > INT_DIGITS:
        return -math.inf if text.startswith("-") else math.inf
    return int(text)


def _decoded(part: bytes) -> tuple[float | None, Values]:
    text = part.decode(errors="replace")
    try:
        data = json.loads(text, parse_int=_int)
    except (ValueError, RecursionError, MemoryError):
        if "'" not in text:
            return None, {}
        try:  # the HuggingFace Trainer's repr of a dict: literals only, bounded above
            import ast  # here: only a dict printed as a repr pays for it

            data = ast.literal_eval(_LONG_INT.sub("1e999", _BARE.sub(r"\g<1>1e999", text)))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None, {}
    return _from_mapping(data)


def _bar(line: bytes) -> tuple[float | None, Values]:
    """After the bar's rate: tqdm's postfix or rich's columns; the step is the bar's `n`,
    plus `Epoch E` times its total (Lightning)."""
    tail = line[-SCAN_BAR:]
    rate = _RATE.search(tail)  # the bar's (its first): text printed after it cannot pose as one
    if rate is None:
        return None, {}
    at = rate.end()
    after = tail[at:]
    if after.startswith(b","):  # tqdm: the postfix ends at the bracket
        end = after.find(b"]")
        items = after[1:end].split(b",") if end > 0 else []
        found = [_BAR_ITEM.fullmatch(i) for i in items]
        if not found or None in found:
            return None, {}
        pairs = [(m[1], m[2]) for m in found if m is not None]
    elif _RICH_ITEMS.fullmatch(after):
        pairs = [(m[1], m[2]) for m in _RICH_ITEM.finditer(after)]
    else:
        return None, {}
    values = {k.decode(): float(v) for k, v in pairs if k.decode() not in BAR_SKIP}
    if not values:
        return None, {}
    step = None
    counts = _BAR_N.findall(tail[:at])
    if counts:
        n, total = (float(x) for x in counts[-1])
        epoch = _BAR_EPOCH.search(tail[:at])
        step = n + (float(epoch[1]) * total if epoch else 0.0)
    return step, values


def _split(
    pairs: Iterable[tuple[str, float]], step_keys: Sequence[str] = STEP_KEYS
) -> tuple[float | None, Values]:
    """The first of `step_keys` found is the step; the rest are values."""
    step: float | None = None
    values: Values = {}
    for k, f in pairs:
        if k in step_keys and step is None:
            step = f
        else:
            values[k] = f
    return step, values


def _groups(m: re.Match[bytes]) -> tuple[float | None, Values]:
    pairs = []
    for k, v in m.groupdict().items():
        with contextlib.suppress(ValueError, TypeError):
            if v is not None:
                pairs.append((k, float(v)))
    return _split(pairs, ("step",))


def _pairs(text: bytes) -> tuple[float | None, Values]:
    found = _PAIR.finditer(text)
    return _split((m["key"].decode()[:NAME_MAX], float(m["value"])) for m in found)


def metrics_dir(adir: str) -> str:
    return os.path.join(adir, METRICS_DIR)


class Writer:
    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1
        try:
            self.size = os.path.getsize(path)  # an agent started again on the same file
        except OSError:
            self.size = 0
        self.counts: dict[str, int] = {}  # points per name: the step of a stepless line
        self.last: dict[str, float] = {}  # per name, wall time of the last point (thinning)
        self.step: float | None = None  # the last step a line gave
        self.nonfinite = 0  # values dropped (not finite) since the last line written
        self.over_names = 0  # values of names past MAX_NAMES since the last line written

    def add(self, step: float | None, values: Values, wall: float, nonfinite: int = 0) -> None:
        self.nonfinite += nonfinite
        new = [k for k in values if k not in self.counts]
        if len(self.counts) + len(new) > MAX_NAMES:  # past the cap: counted, not written
            over = new[MAX_NAMES - len(self.counts) :]
            self.over_names += len(over)
            values = {k: v for k, v in values.items() if k not in over}
        if not values:
            return
        if self.size >= HARD_MAX:
            return
        if self.size >= SOFT_MAX:
            values = {k: v for k, v in values.items() if wall - self.last.get(k, 0.0) >= THIN_S}
            if not values:
                return
        counted = step is None and self.step is None
        if step is None:  # the rank's last step, else how many points the names had
            step = (
                self.step if self.step is not None else max(self.counts.get(k, 0) for k in values)
            )
        else:
            self.step = step
        for k in values:
            self.counts[k] = self.counts.get(k, 0) + 1
            self.last[k] = wall
        s = int(step) if float(step).is_integer() else step
        point: dict[str, Any] = {"t": round(wall, 3), "s": s, "m": values}
        if counted:  # no step of the rank's: a count, from 0 again in every attempt
            point[COUNTED] = 1
        self._write(point)

    def _write(self, point: dict[str, Any]) -> None:
        if self.nonfinite or self.over_names:
            point["x"] = {"nonfinite": self.nonfinite, "names": self.over_names}
        data = (json.dumps(point) + "\n").encode()
        try:
            if self.fd < 0:
                self.fd = writable_fd(self.path)  # a rank's FIFO there is replaced
            os.write(self.fd, data)
        except OSError:
            return
        self.size += len(data)
        self.nonfinite = self.over_names = 0

    def close(self) -> None:
        if (self.nonfinite or self.over_names) and self.size < HARD_MAX:
            point: dict[str, Any] = {"t": round(time.time(), 3), "s": self.step or 0, "m": {}}
            if self.step is None:  # no step of the rank's
                point[COUNTED] = 1
            self._write(point)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Metrics:
    def __init__(self, adir: str, config: Config) -> None:
        self.folder = metrics_dir(adir)
        self.config = config
        self.writers: dict[str, Writer | None] = {}

    def __call__(self, name: str, line: bytes) -> None:
        try:
            writer = self.writers[name]
        except KeyError:
            writer = self._writer(name) if self.config.wants(name) else None
            self.writers[name] = writer
        if writer is None:
            return
        try:
            step, values, dropped = read(line, self.config)
        except Exception:  # noqa: BLE001 - read() is total; a line never stops the agent
            return
        if values or dropped:
            writer.add(step, values, time.time(), dropped)

    def close(self) -> None:
        for w in self.writers.values():
            if w is not None:
                w.close()

    def _writer(self, name: str) -> Writer | None:
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
        except OSError:
            return None
        return Writer(os.path.join(self.folder, name + ".jsonl"))


CONFIG_FILE = METRICS_CONFIG  # in the run directory, written at submission


def read_config(adir: str) -> dict[str, Any] | None:
    data = read_json(metrics_config(adir))
    return data if isinstance(data, dict) else None


def hook(adir: str, data: dict[str, Any] | None = None) -> Metrics | None:
    if data is None:
        data = read_config(adir)
    try:
        config = Config.from_json(data if isinstance(data, dict) else None)
    except (TypeError, ValueError, re.error):
        config = Config()
    return Metrics(adir, config) if config.enabled else None
