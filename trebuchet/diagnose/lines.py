"""One log line as diagnosis sees it: who wrote it (a rank prefix) and when (a timestamp).

Prefixes: torch's `[rank3]:`, torchrun --tee's `[default0]:` (a local rank), srun -l's
`3: `, OpenMPI's `[1,3]<stderr>:`, Determined's `[rank=3] `; a timestamp may come first,
and torch's C++ glog lines carry `[E1129 09:55:18.260 file.cpp:12]`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

LEAD_TS = re.compile(r"^\s*(\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?Z?)\s+")
PREFIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\[rank(\d+)\]:\s?"), "rank"),
    (re.compile(r"^\[rank[= ](\d+)\]:?\s?", re.I), "rank"),  # Determined's [rank=3], [rank 3]
    (re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?"), "rank"),
    (re.compile(r"^\[[A-Za-z_][A-Za-z_-]*?(\d+)\]:\s?"), "local_rank"),  # torchrun's [default0]:
)
RANK_ANY = re.compile(r"\[rank(\d+)\]:\s?")  # after a progress bar or a viewer's line number
SRUN_LABEL = re.compile(r"^\s*(\d+): ")
ISO_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T_](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?")
GLOG_TS = re.compile(r"^\[?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?")


# Terminal control a log can hold before (or inside) a line: colour codes and other CSI
# sequences, OSC titles, two-character escapes, and the C0 controls a terminal does not
# show (NUL, BEL, BS: not TAB, not CR, which shown() reads below).
TERMINAL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
)
TEXT_MAX = 2048  # characters of a line diagnosis reads
DIGITS_MAX = 18  # a rank, a size or a sequence number of more digits is no number


def number(digits: str) -> int | None:
    """`\\d+` as an int; None past DIGITS_MAX digits (int() refuses 4,300 and more: a rank
    printing `[rank<5000 digits>]:` must not stop the diagnosis)."""
    return int(digits) if len(digits) <= DIGITS_MAX else None


@dataclass
class LogLine:
    text: str  # without the rank prefixes and leading timestamp
    raw: str  # as written (trimmed)
    rank: int | None = None
    local_rank: int | None = None
    ts: float | None = None
    pos: int = 0  # order within its source


def parse_ts(text: str) -> float | None:
    """Seconds since the epoch for an ISO or glog timestamp near the line's start."""
    if m := ISO_TS.search(text[:64]):
        y, mo, d, h, mi, s, frac = m.groups()
    elif m := GLOG_TS.match(text):  # glog has no year: this year's, good enough to order lines
        mo, d, h, mi, s, frac = m.groups()
        y, frac = str(time.localtime().tm_year), (frac or "")[:6]
    else:
        return None
    try:
        base = time.mktime((int(y), int(mo), int(d), int(h), int(mi), int(s or 0), 0, 0, -1))
    except (OverflowError, ValueError):
        return None
    return base + (float(f"0.{frac}") if frac else 0.0)


# A launcher's label, written once at a line's start (srun -l's `3: `, a heterogeneous
# job's `P1 3: `, torch's `[rank3]:`, torchrun's `[default0]:`, OpenMPI's `[1,3]<stderr>:`):
# the whole line's, not only what precedes its first carriage return.
LABEL = re.compile(
    r"[ \t]*(?:P\d+ )?\d+: |\[[\w=, -]{1,40}\]:[ \t]?|\[\d+,\d+\]<std(?:out|err)>:[ \t]?"
)


def visible(line: str) -> str:
    """The line as a terminal leaves it: without its control sequences, and of the parts a
    carriage return separates, the last one with text (a progress bar's `50%|##\r` before
    `srun: Job step aborted` is overwritten), still behind the launcher's label the line
    began with (`1:  50%|##\rTraceback` is rank 1's). The scanner reads every log line
    through it (scan.py), so each anchored pattern (`^srun: `, the catalog's) sees what the
    user saw. Linear: no list of parts (a line of ten million carriage returns)."""
    line = TERMINAL.sub("", line)
    if "\r" in line:
        label = m.group() if (m := LABEL.match(line)) else ""
        end = len(line.rstrip())  # just past the last character with text
        start = line.rfind("\r", 0, end) + 1
        stop = line.find("\r", end)
        part = line[start : stop if stop >= 0 else len(line)] if end else ""
        line = part if start <= len(label) or part.startswith(label) else label + part
    return line


def parse(raw: str, pos: int = 0, srun_labels: bool = False) -> LogLine:
    """Split a line into its prefixes and its text; the rank comes from the innermost tag.
    Only the first TEXT_MAX characters are read: a cause is stated at a line's start, and
    a rank's megabyte line must not cost the catalog's patterns its square."""
    raw = raw[:TEXT_MAX].rstrip("\r\n")
    text = raw
    ts = None
    m = LEAD_TS.match(text)
    if m:
        ts = parse_ts(m.group(1))
        text = text[m.end() :]
    rank = local = None
    if srun_labels:
        m = SRUN_LABEL.match(text)
        if m and number(m.group(1)) is not None:
            rank = number(m.group(1))
            text = text[m.end() :]
    changed = True
    while changed:
        changed = False
        for rx, kind in PREFIXES:
            m = rx.match(text)
            if m and number(m.group(1)) is not None:
                if kind == "rank":
                    rank = number(m.group(1))
                else:
                    local = number(m.group(1))
                text = text[m.end() :]
                changed = True
                break
    if rank is None:
        m = RANK_ANY.search(text, 0, 200)
        if m and number(m.group(1)) is not None:
            rank = number(m.group(1))
            text = text[m.end() :]
    if ts is None:
        ts = parse_ts(text)
    return LogLine(text=text, raw=raw.strip()[:500], rank=rank, local_rank=local, ts=ts, pos=pos)
