"""The agent's log reader: when each of its ranks last made progress, and its last line.

Stepped from the agent's poll, never blocking: a stat and one bounded read per file and
step (a rank that writes faster is skipped to its log's end: its progress is plain
anyway). Progress is recorded as `attempt-<n>/progress/<name>` (mtime: the last progress;
content: the last line), which the controller's hang watch reads on every engine.
"""

from __future__ import annotations

import os
import time

from ..rundir.records import write_regular
from ..rundir.regular import open_fd

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Callable

    from .display_lines import Splitter

    OnLine = Callable[[str, bytes], None]  # (process name: rank-3, line)

STEP_S = 1.0
CHUNK = 256 << 10  # bytes read per file and step at most (~0.7 ms of splitting)
LINE_MAX = 512
LINE_CAP = 16 << 10  # lines handed to on_line (a metrics line may be long: metrics.py)
PROGRESS_DIR = "progress"
HEARTBEAT_SUFFIX = ".heartbeat"


def progress_dir(adir: str) -> str:
    return os.path.join(adir, PROGRESS_DIR)


def heartbeat_path(adir: str, name: str) -> str:
    return os.path.join(progress_dir(adir), name + HEARTBEAT_SUFFIX)


class Tracked:
    def __init__(self, name: str, log: str, heartbeat: str) -> None:
        self.name = name
        self.log = log
        self.heartbeat = heartbeat
        self.offset = 0
        self.splitter: Splitter | None = None  # made at the first read (_read)
        self.beat_mtime = 0.0
        self.last_progress: float | None = None
        self.last_line = b""
        self.dirty = False  # progress not yet recorded


class Progress:
    def __init__(self, adir: str, on_line: OnLine | None = None) -> None:
        self.adir = adir
        self.on_line = on_line
        self.tracked: list[Tracked] = []
        self.next_step = 0.0
        self._dir_made = False

    def track(self, name: str) -> str:
        """The path of its heartbeat file, for `$TREB_HEARTBEAT`."""
        beat = heartbeat_path(self.adir, name)
        self.tracked.append(Tracked(name, os.path.join(self.adir, name + ".log"), beat))
        return beat

    def step(self, force: bool = False) -> None:
        mono = time.monotonic()
        if not force and mono < self.next_step:
            return
        self.next_step = mono + STEP_S
        wall = time.time()
        for t in self.tracked:
            self._read(t, wall)
            self._beat(t, wall)
            if t.dirty:
                self._record(t)

    def _read(self, t: Tracked, wall: float) -> None:
        try:
            fd = open_fd(t.log)  # a regular file only: never a FIFO (regular.py)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if st.st_size < t.offset:  # truncated: start again
                t.offset = 0
                t.splitter = None
            if st.st_size == t.offset:
                return
            if st.st_size - t.offset > CHUNK:  # more than a step reads: to the end
                t.offset = st.st_size - CHUNK
                t.splitter = None
            data = os.pread(fd, CHUNK, t.offset)
        except OSError:
            return
        finally:
            os.close(fd)
        if not data:
            return
        if t.splitter is None:  # at the first output: its module's regexes (a silent run
            from .display_lines import Splitter  # never needs them)

            t.splitter = Splitter(cap=LINE_CAP)
        t.offset += len(data)
        lines = t.splitter.feed(data)
        if lines:
            t.last_line = lines[-1]
            if self.on_line is not None:
                for line in lines:
                    self.on_line(t.name, line)
        elif t.splitter.partial_len:  # a line in the making (a progress bar without \r)
            t.last_line = b"".join(t.splitter.partial)[-LINE_MAX:]
        t.last_progress = wall
        t.dirty = True

    def _beat(self, t: Tracked, wall: float) -> None:
        try:
            mtime = os.stat(t.heartbeat).st_mtime
        except OSError:
            return
        if mtime > t.beat_mtime:
            t.beat_mtime = mtime
            t.last_progress = max(t.last_progress or 0.0, min(mtime, wall))
            t.dirty = True

    def _record(self, t: Tracked) -> None:
        folder = progress_dir(self.adir)
        path = os.path.join(folder, t.name)
        try:
            if not self._dir_made:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                self._dir_made = True
            write_regular(path, t.last_line[-LINE_MAX:] + b"\n", truncate=True)
            stamp = t.last_progress or time.time()
            os.utime(path, (stamp, stamp))
        except OSError:
            return
        t.dirty = False
