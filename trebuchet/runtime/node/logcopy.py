"""A copy of the ranks' logs on the node agent's own stdout, each line prefixed with its
label (`[1:0] ...`), for engines whose logs are what a node's process prints (SkyPilot's
`sky logs`, `kubectl logs`).

Why a thread that tails files: each rank writes its own log file (nothing is lost if the
agent dies, and the records name it), and supervision (signals, timeouts, teardown) must
never wait for output. The thread only reads those files and writes to stdout: when stdout
blocks (a slow log collector), the thread blocks, not the agent. Each byte is split once
(a line longer than MAX_LINE is cut into pieces), and at the end what is left is copied for
at most FINAL_S seconds: the files hold everything.
"""

from __future__ import annotations

import os
import threading
import time

from ..rundir.regular import open_fd
from ..watch.display_lines import Splitter

CHUNK = 1 << 16  # bytes read from one file at a time
MAX_LINE = 1 << 16  # a longer line is copied in pieces of this size
POLL_S = 0.1  # between rounds when no file grew
FINAL_S = 5.0  # the copy after the processes ended, at most


class _Stream:
    """One log file being copied: where it was read to, the line not yet ended."""

    def __init__(self, label: str, path: str) -> None:
        self.prefix = f"[{label}] ".encode()
        self.path = path
        self.fd = -1
        # A file already there (an earlier start of this node in the same folder) is
        # copied from its current end only.
        try:
            self.start = os.path.getsize(path)
        except OSError:
            self.start = 0
        self.lines = Splitter(MAX_LINE)  # the view's splitting: linear, cut, inert

    def read(self) -> bytes:
        """What the file gained since the last call, as prefixed whole lines."""
        if self.fd < 0:
            try:
                self.fd = open_fd(self.path)  # a rank's FIFO never blocks the copy
            except OSError:
                return b""  # not created yet (or not a regular file)
            os.lseek(self.fd, self.start, os.SEEK_SET)
        try:
            data = os.read(self.fd, CHUNK)
        except OSError:
            return b""
        return self.feed(data) if data else b""

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.prefix + line + b"\n" for line in self.lines.feed(data))

    def rest(self) -> bytes:
        """The line not yet ended, as prefixed lines (the stream ended)."""
        return b"".join(self.prefix + line + b"\n" for line in self.lines.flush())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class LogCopy:
    """Copies log files (label, path) to a file descriptor (stdout) until `finish`."""

    def __init__(
        self,
        streams: list[tuple[str, str]],
        notes: list[str] | None = None,
        out_fd: int = 1,
        beat: tuple[bytes, float] | None = None,
    ) -> None:
        # (line, seconds): a heartbeat line between whole lines (ssh: runtime/job/nodeloss.py)
        self.beat = beat
        self.streams = [_Stream(label, path) for label, path in streams]
        # The agent's own lines (`treb: ...`), appended by the supervising thread and
        # written here, so that a blocked stdout never holds supervision up.
        self.notes = notes if notes is not None else []
        self.out_fd = out_fd
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="treb-log-copy", daemon=True)
        self.broken = False  # stdout went away: the copy stopped, the run goes on

    def start(self) -> LogCopy:
        self._thread.start()
        return self

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.broken:
            try:
                view = view[os.write(self.out_fd, view) :]
            except InterruptedError:
                continue
            except OSError:
                self.broken = True

    def _round(self) -> bool:
        """One read of every file; True when one of them grew."""
        grew = False
        for stream in self.streams:
            data = stream.read()
            if data:
                grew = True
                self._write(data)
        while self.notes:  # after the logs: a failure is said once its log is copied
            grew = True
            self._write(f"treb: {self.notes.pop(0)}\n".encode())
        return grew

    def _run(self) -> None:
        beat_at = time.monotonic()
        while not self._stop.is_set() and not self.broken:
            if self.beat is not None and time.monotonic() >= beat_at:
                beat_at = time.monotonic() + self.beat[1]
                self._write(self.beat[0])
            if not self._round():
                self._stop.wait(POLL_S)
        end = time.monotonic() + FINAL_S
        while not self.broken and time.monotonic() < end and self._round():
            pass
        self._round()  # the agent's last notes
        for stream in self.streams:
            if not self.broken:  # a last line without a newline
                self._write(stream.rest())
            stream.close()

    def finish(self) -> bool:
        """Copy what is left (bounded) and stop; False when it was cut short."""
        self._stop.set()
        self._thread.join(FINAL_S + 1.0)
        return not self._thread.is_alive() and not self.broken
