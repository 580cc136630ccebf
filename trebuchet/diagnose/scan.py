"""Read a log from its end and keep only the lines that can explain a failure.

A failing job's story is at the end of each log, so a log is read backwards in doubling
chunks until its earliest error-looking line has quiet output before it (or MAX_BYTES):
256 rank logs of 2 GB cost tens of kilobytes each. Candidates are found with bytes.find on
a lowercased chunk, never a regex over the text; only they are decoded and classified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.diagnose import catalog
from trebuchet.diagnose.lines import parse, visible
from trebuchet.runtime.rundir.regular import open_regular

CHUNK = 64 << 10
QUIET = 16 << 10  # this much output without an error before the first one: episode found
MAX_BYTES = 128 << 20  # per file; a log bigger than this is read only this far back
OVERLAP = 64  # bytes of the chunk after, searched with each: longer than any keyword

KEYWORDS = (
    b"error", b"exception", b"traceback", b"kill", b"signal", b"exit", b"timed out",
    b"timeout", b"fault", b"cancel", b"refused", b"unreachable", b"not set", b"out of memory",
    b"in use", b"root cause", b"watchdog", b"oom", b"abort", b"illegal", b"terminat",
    b"no module", b"core dump", b"fatal", b"fail", b"due to", b"no route", b"not found",
    b"cannot", b"eaddrinuse", b"ncclunique", b"crash on", b"peer", b"broken pipe", b"ifname",
    b"no such file", b"can't open", b"no space left", b"quota exceeded", b"permission denied",
    b"unexpected eof",
    # srun's and salloc's words on the job (diagnose/engine._stopped_by_slurm, sources.py):
    # the job id they ran in, a Ctrl+C, an allocation revoked, a step begun (sources._Steps)
    b"allocated resources", b"waiting for resources", b"ctrl-c", b"revoked", b"step created for",
)  # fmt: skip
# A header and how many following lines belong to it (frames, report fields).
BLOCKS = ((b"traceback (most recent call last)", 120), (b"root cause (first observed", 60),
          (b"failures:", 80), (b"what():", 2),
          (b"fatal python error:", 40))  # fmt: skip  # faulthandler: the threads' stacks


@dataclass
class Scan:
    """What was kept of one file: candidate lines in file order."""

    path: Path
    size: int
    start: int  # offset the kept text starts at (0: the whole file was read)
    lines: list[str] = field(default_factory=list)
    last_lines: list[str] = field(default_factory=list)  # the file's final lines


def _keyword_starts(low: bytes) -> set[int]:
    """Offsets of the lines holding a keyword (lines cut at the chunk's start start at 0)."""
    starts: set[int] = set()
    for kw in KEYWORDS:
        i = low.find(kw)
        while i >= 0:
            starts.add(low.rfind(b"\n", 0, i) + 1)
            e = low.find(b"\n", i)
            if e < 0:
                break
            i = low.find(kw, e)
    return starts


def _block_starts(low: bytes) -> set[int]:
    """Offsets of the lines that follow a traceback or torchrun report header."""
    starts: set[int] = set()
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
    return starts


def _line(buf: bytes, start: int) -> str:
    """The line at `start` as a terminal shows it (lines.visible: no colour codes)."""
    e = buf.find(b"\n", start)
    return visible(buf[start : e if e >= 0 else len(buf)].decode(errors="replace"))


def _first_error(data: bytes, starts: set[int]) -> int | None:
    """Offset of the earliest error-looking line among the chunk's keyword lines."""
    for s in sorted(starts):
        if catalog.errorish(parse(_line(data, s)).text):
            return s
    return None


def scan(path: Path, chunk: int = CHUNK, max_bytes: int = MAX_BYTES) -> Scan:
    """Read `path` backwards until the error episode's start; keep its candidate lines."""
    try:
        fh = open_regular(path)  # a missing log (or a FIFO) is an empty scan, not an error
    except OSError:
        return Scan(Path(path), 0, 0)
    with fh:
        size = os.fstat(fh.fileno()).st_size
        pos = size
        parts: list[bytes] = []
        found: set[int] = set()  # absolute offsets of keyword lines (or of a chunk's start)
        first: int | None = None  # absolute offset of the earliest error line seen
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step)
            ahead = parts[-1][:OVERLAP] if parts else b""  # a keyword across the boundary
            parts.append(data)
            if first == pos + step:  # the earliest error line was cut at the last chunk's
                nl = data.rfind(b"\n")  # start: it begins here, or earlier still (a
                first = pos + nl + 1 if nl >= 0 else pos  # progress bar's long line)
            starts = {s for s in _keyword_starts((data + ahead).lower()) if s < step}
            found.update(pos + s for s in starts)
            off = _first_error(data, starts)
            if off is not None:
                first = pos + off
            if pos == 0 or size - pos >= max_bytes:
                break
            if first is None or first - pos >= QUIET:
                break  # no error at the end, or a quiet stretch before the first one
            chunk = min(chunk * 2, 8 << 20)
    buf = b"".join(reversed(parts))
    cut = buf.find(b"\n") + 1 if pos > 0 else 0  # drop the partial first line
    starts = {buf.rfind(b"\n", 0, a - pos) + 1 for a in found if a - pos >= cut}
    starts |= {s for s in _block_starts(buf.lower()) if s >= cut}
    lines = [_line(buf, s) for s in sorted(starts)]
    # lines as a terminal shows them: cut at newlines only (a progress bar's carriage
    # returns are its updates); a line the window cut keeps its end where that is a bar's
    tail = buf[max(cut, len(buf) - 4096) :].decode(errors="replace").split("\n")
    cut_line = len(buf) - cut > 4096 and "\r" not in tail[0].rstrip("\r")
    tail = [visible(ln) for ln in (tail[1:] if cut_line else tail)]
    last = [ln for ln in tail if ln.strip()][-5:]
    return Scan(Path(path), size, pos + cut, lines, last)
