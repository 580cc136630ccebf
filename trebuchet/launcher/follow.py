"""Tail many rank logs at once and print whole lines with a `[node:local]` prefix.

Files hold exactly what each process wrote; only the terminal view is split into lines
(on \\n and \\r, so progress bars stay readable) and each line goes out in one write, so
ranks never interleave mid-line. A partial line is held until it ends or goes stale.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

STALE_PARTIAL_S = 1.0


class _Tail:
    def __init__(self, label: str, path: Path, start_at_end: bool = False) -> None:
        self.label = label
        self.path = path
        self.offset = 0
        self.partial = b""
        self.partial_since = 0.0
        if start_at_end:
            with contextlib.suppress(FileNotFoundError):
                self.offset = path.stat().st_size

    def read_new(self) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 20)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


class Follower:
    """Polls a set of log files; `pump()` prints what is new, `close()` flushes the rest."""

    def __init__(
        self,
        out: BinaryIO | None = None,
        prefix: Callable[[str], bytes] | None = None,
    ) -> None:
        self.out = out or sys.stdout.buffer
        self.tails: dict[Path, _Tail] = {}
        self.prefix = prefix or (lambda label: f"[{label}] ".encode())

    def add(self, label: str, path: Path, tail_lines: int | None = None) -> None:
        if path in self.tails:
            return
        t = _Tail(label, path)
        if tail_lines is not None:
            t.offset = _offset_of_last_lines(path, tail_lines)
        self.tails[path] = t

    def pump(self) -> int:
        """Print complete new lines from every file; returns the number of bytes read."""
        total = 0
        now = time.monotonic()
        for t in self.tails.values():
            data = t.read_new()
            while data:
                total += len(data)
                self._emit(t, data, now)
                data = t.read_new()
            if t.partial and now - t.partial_since > STALE_PARTIAL_S:
                self._write(t.label, t.partial)
                t.partial = b""
        if total:
            self.out.flush()
        return total

    def close(self) -> None:
        self.pump()
        for t in self.tails.values():
            if t.partial:
                self._write(t.label, t.partial)
                t.partial = b""
        self.out.flush()

    def _emit(self, t: _Tail, data: bytes, now: float) -> None:
        if not t.partial:
            t.partial_since = now
        buf = t.partial + data
        start = 0
        for i, ch in enumerate(buf):
            if ch in (10, 13):  # \n or \r
                if i > start:
                    self._write(t.label, buf[start:i])
                start = i + 1
        t.partial = buf[start:]

    def _write(self, label: str, line: bytes) -> None:
        self.out.write(self.prefix(label) + line + b"\n")


def _offset_of_last_lines(path: Path, n: int) -> int:
    """Byte offset where the last `n` lines of `path` begin."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if n <= 0:
        return size
    with open(path, "rb") as fh:
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
            for i in range(len(block) - 1, -1, -1):
                if block[i] == 10:
                    found += 1
                    if found == n:
                        return pos + i + 1
    return 0


def is_tty() -> bool:
    return os.isatty(sys.stdout.fileno()) if hasattr(sys.stdout, "fileno") else False
