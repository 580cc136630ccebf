"""Read a log from its end and keep only the lines that can explain a failure.

A failing job's story is at the end of each log: the first real error and the cascade it
set off. So a log is read backwards in chunks until the earliest error-looking line has a
stretch of quiet output before it (or the file starts, or MAX_BYTES were read): a 2 GB
directory of 256 rank logs costs a few hundred kilobytes per file, not 2 GB.

Candidate lines are found with bytes.find on a lowercased chunk (C speed), never with a
regular expression over the whole text; only those lines are decoded and classified.
Tracebacks and torchrun's failure report keep the lines that follow their header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.diagnose import catalog
from trebuchet.diagnose.lines import parse

CHUNK = 256 << 10
QUIET = 64 << 10  # this much output without an error before the first one: episode found
MAX_BYTES = 128 << 20  # per file; a log bigger than this is read only this far back

KEYWORDS = (
    b"error", b"exception", b"traceback", b"kill", b"signal", b"exit", b"timed out",
    b"timeout", b"fault", b"cancel", b"refused", b"unreachable", b"not set", b"out of memory",
    b"in use", b"root cause", b"watchdog", b"oom", b"abort", b"illegal", b"terminat",
    b"no module", b"core dump", b"fatal", b"fail", b"due to", b"no route", b"not found",
    b"cannot", b"eaddrinuse", b"ncclunique", b"crash on", b"peer", b"broken pipe",
)  # fmt: skip
# A header and how many following lines belong to it (frames, report fields).
BLOCKS = ((b"traceback (most recent call last)", 120), (b"root cause (first observed", 60),
          (b"failures:", 80), (b"what():", 2))  # fmt: skip


@dataclass
class Scan:
    """What was kept of one file: candidate lines in file order."""

    path: Path
    size: int
    start: int  # offset the kept text starts at (0: the whole file was read)
    lines: list[str] = field(default_factory=list)
    last_lines: list[str] = field(default_factory=list)  # the file's final lines

    @property
    def complete(self) -> bool:
        return self.start == 0


def _line_starts(low: bytes) -> list[int]:
    """Offsets of the lines holding a keyword or inside a block, sorted."""
    starts: set[int] = set()
    for kw in KEYWORDS:
        i = low.find(kw)
        while i >= 0:
            s = low.rfind(b"\n", 0, i) + 1
            starts.add(s)
            e = low.find(b"\n", i)
            if e < 0:
                break
            i = low.find(kw, e)
    for header, count in BLOCKS:
        i = low.find(header)
        while i >= 0:
            e = low.rfind(b"\n", 0, i) + 1
            for _ in range(count + 1):
                starts.add(e)
                e = low.find(b"\n", e) + 1
                if e <= 0 or e >= len(low):
                    break
            i = low.find(header, i + len(header))
    return sorted(starts)


def _extract(buf: bytes, starts: list[int]) -> list[str]:
    out = []
    for s in starts:
        e = buf.find(b"\n", s)
        out.append(buf[s : e if e >= 0 else len(buf)].decode(errors="replace").rstrip("\r"))
    return out


def _first_error(buf: bytes) -> int | None:
    """Offset of the earliest error-looking line in buf, or None."""
    low = buf.lower()
    for s in _line_starts(low):
        e = buf.find(b"\n", s)
        text = buf[s : e if e >= 0 else len(buf)].decode(errors="replace")
        if catalog.errorish(parse(text).text):
            return s
    return None


def scan(path: Path, chunk: int = CHUNK, max_bytes: int = MAX_BYTES) -> Scan:
    """Read `path` backwards until the error episode's start; keep its candidate lines."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - a missing log is an empty scan, not an error
    except OSError:
        return Scan(Path(path), 0, 0)
    with fh:
        size = os.fstat(fh.fileno()).st_size
        pos = size
        buf = b""
        first: int | None = None  # absolute offset of the earliest error line seen
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step)
            buf = data + buf
            off = _first_error(data)
            if off is not None:
                first = pos + off
            if pos == 0 or size - pos >= max_bytes:
                break
            if first is None or first - pos >= QUIET:
                break  # no error at the end, or a quiet stretch before the first one
            chunk = min(chunk * 2, 8 << 20)
        if pos > 0:  # drop the partial first line
            cut = buf.find(b"\n") + 1
            buf = buf[cut:]
            pos += cut
    lines = _extract(buf, _line_starts(buf.lower()))
    tail = buf[-4096:].decode(errors="replace").splitlines()
    last = [ln for ln in tail[1:] if ln.strip()][-5:] if len(buf) > 4096 else tail[-5:]
    return Scan(Path(path), size, pos, lines, [ln for ln in last if ln.strip()])
