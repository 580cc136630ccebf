"""Tail many rank logs at once and print whole lines with a `[node:local]` prefix.

Files hold exactly what each process wrote; only the view is split into lines and each
read's lines go out in one write, so ranks never interleave mid-line. With `skip_over`
(the attached view) a log too far ahead is skipped to its last `KEEP_TAIL` bytes, with a
note, and with `redraw` a `\r` progress bar shows its latest state at most once a second;
`treb logs` sets neither.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.runtime.watch.display_lines import Splitter
from trebuchet.view.fold import Fold

STALE_PARTIAL_S = 1.0
READ = 1 << 20
KEEP_TAIL = 64 * 1024
NOTE_EVERY_S = 1.0
LOG_NAME = re.compile(r"(rank|node)-([0-9]+)\.log")


def attempt_logs(adir: Path) -> list[tuple[str, int, Path]]:
    """(`rank` | `node`, its number, path) of an attempt's logs: node logs first, by number."""
    try:
        names = os.listdir(adir)
    except OSError:
        return []
    return sorted((m[1], int(m[2]), adir / n) for n in names if (m := LOG_NAME.fullmatch(n)))


class Out(Protocol):
    """Where the lines go: a binary file (sys.stdout.buffer, BytesIO) or `live.FdOut`."""

    def write(self, data: bytes, /) -> int: ...
    def flush(self) -> None: ...


class _Tail:
    def __init__(self, label: str, path: Path, redraw: bool = False) -> None:
        self.label = label
        self.path = path
        self.offset = 0
        self.lines = Splitter(redraw=redraw)
        self.partial_since = 0.0
        self.resync = False  # after a skip: drop the rest of the line it landed in
        self.skipped = 0  # bytes skipped and not yet noted
        self.noted_at = 0.0

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return -1


class Follower:
    """Polls a set of log files; `pump()` prints what is new, `close()` flushes the rest."""

    def __init__(
        self,
        out: Out | None = None,
        prefix: Callable[[str], bytes] | None = None,
        skip_over: int | None = None,
        redraw: bool = False,
        sink: Callable[[str, list[bytes]], None] | None = None,
        fold: Fold | None = None,
    ) -> None:
        self.out: Out = out or sys.stdout.buffer
        self.fold = fold  # the live view: knock-on tracebacks folded (view/fold.py)
        self.sink = sink  # instead of printing: (label, lines), e.g. dedup.py's grouping
        self.redraw = redraw  # \r overwrites (lines.Splitter): the live view's progress bars
        self.tails: dict[Path, _Tail] = {}
        self.prefix = prefix or (lambda label: f"[{label}] ".encode())
        self.skip_over = skip_over
        self.stop = False  # set from another thread: return as soon as possible

    def add(self, label: str, path: Path, tail_lines: int | None = None) -> None:
        if path in self.tails:
            return
        t = _Tail(label, path, self.redraw)
        if tail_lines is not None:
            t.offset = _offset_of_last_lines(path, tail_lines)
        self.tails[path] = t

    def pump(self) -> int:
        """Print complete new lines from every file; returns the number of bytes read.

        Reads at most what each file held when it was looked at, so a file that keeps
        growing cannot hold the others (or the caller) back."""
        total = 0
        now = time.monotonic()
        for t in list(self.tails.values()):
            if self.stop:
                break
            total += self._pump_tail(t, now)
        if self.fold is not None:
            for path, lines in self.fold.due(now):
                self._emit(self.tails[path], lines)
        self.out.flush()
        return total

    def close(self) -> None:
        self.pump()
        for t in self.tails.values():
            if self.stop:
                break
            self._write(t, t.lines.flush())
            self._note(t, None)
        if self.fold is not None and not self.stop:
            for path, lines in self.fold.flush():
                self._emit(self.tails[path], lines)
        self.out.flush()

    def _pump_tail(self, t: _Tail, now: float) -> int:
        size = t.size()
        if size <= t.offset:
            self._stale(t, now)
            return 0
        if self.skip_over is not None and size - t.offset > self.skip_over:
            start = max(t.offset, size - KEEP_TAIL)
            t.skipped += start - t.offset + t.lines.partial_len
            t.lines.reset()
            t.offset = start
            t.resync = True
        read = 0
        try:
            fh = open_regular(t.path)  # a rank's FIFO never freezes the view
        except OSError:  # removed since, or not a regular file (regular.py)
            return 0
        with fh:
            if t.resync and t.offset:  # landed right after a line end: nothing to drop
                fh.seek(t.offset - 1)
                t.resync = fh.read(1) not in (b"\n", b"\r")
            fh.seek(t.offset)
            while t.offset < size and not self.stop:
                data = fh.read(min(READ, size - t.offset))
                if not data:
                    break
                t.offset += len(data)
                read += len(data)
                self._feed(t, data, now)
        if t.resync:  # no line end yet: say what is being skipped anyway
            self._note(t, now)
        self._stale(t, now)
        return read

    def _feed(self, t: _Tail, data: bytes, now: float) -> None:
        if t.resync:
            ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
            if not ends:
                t.skipped += len(data)
                return
            t.skipped += min(ends) + 1
            data = data[min(ends) + 1 :]
            t.resync = False
        self._note(t, now)  # before the lines that follow a skip
        if not t.lines.pending:
            t.partial_since = now
        self._write(t, t.lines.feed(data))

    def _stale(self, t: _Tail, now: float) -> None:
        if t.lines.pending and now - t.partial_since > STALE_PARTIAL_S:
            self._write(t, t.lines.flush())

    def _note(self, t: _Tail, now: float | None) -> None:
        """Say what was skipped: at most once a second per log, and at the end (now=None)."""
        if t.skipped and (now is None or now - t.noted_at >= NOTE_EVERY_S):
            self._write(t, [b"[treb: view skipped %s of this output; `treb logs` has all of it]"
                            % _size(t.skipped).encode()])  # fmt: skip
            t.skipped = 0
            t.noted_at = time.monotonic() if now is None else now

    def _write(self, t: _Tail, lines: list[bytes]) -> None:
        if lines and self.fold is not None:
            lines = self.fold.feed(t.path, lines, time.monotonic())
        self._emit(t, lines)

    def _emit(self, t: _Tail, lines: list[bytes]) -> None:
        if lines and self.sink is not None:
            self.sink(t.label, lines)
        elif lines:
            pre = self.prefix(t.label)
            self.out.write(pre + (b"\n" + pre).join(lines) + b"\n")


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def _offset_of_last_lines(path: Path, n: int) -> int:
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    if n <= 0:
        return size
    try:
        fh = open_regular(path)
    except OSError:
        return size
    with fh:
        pos = size
        found = 0
        chunk = 1 << 16
        # A trailing newline ends the last line; it does not start a new one.
        fh.seek(max(0, size - 1))
        if size and fh.read(1) == b"\n":
            pos -= 1
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            end = len(block)
            while (i := block.rfind(b"\n", 0, end)) >= 0:
                found += 1
                if found == n:
                    return pos + i + 1
                end = i
    return 0
