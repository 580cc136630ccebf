"""What a workload reports, read the way madengine reads it.

`performance: <number> <metric>`: the first match in a log wins (`performance: 1.2e3
samples_per_second`, `performance: 95.2/s, tokens_per_sec`); the HuggingFace Trainer's
`'train_samples_per_second': 4.23` (quoted in transformers 5) counts only without one. Logs
are streamed and only lines holding the marker are decoded, so a huge log costs one read.
A non-finite value is no value: it would poison every comparison.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path

from trebuchet.plain import field, record
from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.runtime.watch.metric_reader import NUMBER, PERF  # one reading, also the agents'

HF = re.compile(
    rb"train_samples_per_second['\"]?\s*[:=]\s*(?P<q>['\"]?)(?P<value>" + NUMBER + rb")(?P=q)"
)
CHUNK = 4 << 20
REQUIRED = ("model", "performance", "metric")


@record
class Value:
    value: float
    metric: str
    line: str


@record
class CsvRow:
    model: str
    value: float | None
    metric: str
    extra: dict[str, str] = field(default_factory=dict)


def _first(path: Path, rx: re.Pattern[bytes], marker: bytes) -> re.Match[bytes] | None:
    """The first match of rx in the file, reading it in chunks of whole lines."""
    try:
        fh = open_regular(path)  # a missing log (or a rank's FIFO) reports nothing
    except OSError:
        return None
    carry = b""
    with fh:
        while True:
            chunk = fh.read(CHUNK)
            data = carry + chunk
            if not chunk:
                return rx.search(data) if marker in data else None
            cut = data.rfind(b"\n") + 1
            whole, carry = data[:cut], data[cut:]
            if marker in whole:
                m = rx.search(whole)
                if m:
                    return m
            if len(carry) > CHUNK:  # a huge line without newline: search it as it is
                whole, carry = carry, b""
                m = rx.search(whole) if marker in whole else None
                if m:
                    return m


def _line(m: re.Match[bytes]) -> str:
    s = m.string
    start = s.rfind(b"\n", 0, m.start()) + 1
    end = s.find(b"\n", m.end())
    return s[start : end if end >= 0 else len(s)].decode(errors="replace").strip()[:300]


def performance(path: Path) -> Value | None:
    m = _first(path, PERF, b"performance:")
    if not m or not math.isfinite(float(m["value"])):
        return None
    return Value(float(m["value"]), m["metric"].decode(errors="replace"), _line(m))


def hf_samples_per_second(path: Path) -> Value | None:
    """The HuggingFace Trainer's train_samples_per_second, as samples_per_second."""
    m = _first(path, HF, b"train_samples_per_second")
    if not m or not math.isfinite(float(m["value"])):
        return None
    return Value(float(m["value"]), "samples_per_second", _line(m))


def results_csv(path: Path) -> list[CsvRow]:
    """Rows of a results CSV: columns model, performance, metric; other columns kept."""
    raw = open_regular(path)  # the rank writes it: a FIFO there never blocks `treb results`
    with io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace", newline="") as fh:
        reader = csv.DictReader(fh)
        fields = {(f or "").strip().lower(): f for f in reader.fieldnames or []}
        missing = [c for c in REQUIRED if c not in fields]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        out = []
        for row in reader:
            get = {k: (row.get(v) or "").strip() for k, v in fields.items()}
            try:
                value: float | None = finite(float(get["performance"]))
            except ValueError:
                value = None
            extra = {fields[k]: v for k, v in get.items() if k not in REQUIRED}
            out.append(CsvRow(get["model"], value, get["metric"], extra))
        return out


def finite(v: float | None) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None
