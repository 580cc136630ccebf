"""The attached terminal view: a thread beside the loop that supervises or follows a run.

The loop only hands over new log files (`add`) and messages (`say`) by non-blocking queue
puts, so printing never delays a signal, timeout or teardown. The thread rests four times
the CPU it used (at most a fifth of a core): under a flood it falls behind and skips a log
more than `SKIP_OVER` bytes ahead, with a note (the rank logs keep everything). `close()`
shows what is left, bounded in bytes and time.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path

from trebuchet.runtime.watch.display_lines import inert
from trebuchet.view.dedup import Dedup, key_of
from trebuchet.view.fold import Fold
from trebuchet.view.follow import Follower, Out

POLL_S = 0.05
REST_PER_BUSY = 4.0
SKIP_OVER = 1 << 20
SKIP_AT_END = 256 * 1024
DRAIN_TIMEOUT_S = 2.0


class FdOut:
    """Writes straight to a file descriptor: no buffer (or lock) shared with sys.stdout,
    so a thread stuck on a terminal that stopped reading cannot block the interpreter."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        return len(data)

    def flush(self) -> None:
        pass


class View:
    """Rank logs and `treb:` messages on the terminal, from a thread of its own."""

    def __init__(self, out: Out | None = None, err: Out | None = None,
                 skip_over: int = SKIP_OVER) -> None:  # fmt: skip
        self.out: Out = out or FdOut(sys.stdout.fileno())
        self.err: Out = err or FdOut(sys.stderr.fileno())
        # TREB_DEDUP=1: a line several ranks print about together, once ([0-3] ...)
        self.grouped = Dedup(self.out, []) if os.environ.get("TREB_DEDUP") == "1" else None
        sink = self._grouped if self.grouped is not None else None
        # torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and --local-ranks-filter
        # (cli/torchrun_flags.py): how a rank's lines are labelled, which ranks are shown
        self.template = os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
        shown = os.environ.get("TREB_LOCAL_RANKS_FILTER")
        self.shown = {s.strip() for s in shown.split(",")} if shown else None
        self.prefixes: dict[str, bytes] = {}
        # only the thread touches it; \r progress bars show their latest state
        self.follower = Follower(self.out, prefix=self._prefix, skip_over=skip_over,
                                 redraw=True, sink=sink, fold=Fold())  # fmt: skip
        self._inbox: queue.SimpleQueue[tuple[str, str, Path | None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._closing = False
        self.broken = False  # the terminal went away (closed pipe): the run goes on
        self._thread = threading.Thread(target=self._run, name="treb-view", daemon=True)
        self._thread.start()

    def _grouped(self, key: str, lines: list[bytes]) -> None:
        assert self.grouped is not None
        self.grouped.add(key, lines, time.monotonic())

    def _prefix(self, label: str) -> bytes:
        return self.prefixes.get(label) or f"[{label}] ".encode()

    def add(self, label: str, path: Path) -> None:
        """Show this log from now on (a log already shown is ignored)."""
        node, colon, local = label.partition(":")
        if colon and self.shown is not None and local not in self.shown:
            return  # --local-ranks-filter: this rank's lines stay in its log only
        if colon and self.template is not None:
            from string import Template

            rank = key_of(path)
            text = Template(self.template).safe_substitute(
                role_name=os.environ.get("TREB_ROLE_NAME", "default"), rank=rank,
                local_rank=local)  # fmt: skip
            self.prefixes[label] = inert(text.encode(errors="replace"))
        self._inbox.put(("add", label, path))

    def say(self, text: str) -> None:
        """`treb: text` on stderr, after the rank output read so far."""
        self._inbox.put(("say", text, None))
        self._wake.set()

    def close(self, drain_timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Show what is left (at most SKIP_AT_END bytes of each log), for at most
        `drain_timeout` seconds; then stop the thread wherever it is."""
        self._closing = True
        self._wake.set()
        self._thread.join(drain_timeout)
        self.follower.stop = True

    def _run(self) -> None:
        # Signals go to the main thread, whose handlers the supervision relies on.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                  signal.SIGUSR1, signal.SIGUSR2,
                                                  signal.SIGCHLD})  # fmt: skip
        try:
            while True:
                closing = self._closing
                self._handle_inbox()
                if closing:
                    self.follower.skip_over = SKIP_AT_END
                    self.follower.close()
                    if self.grouped is not None:
                        self.grouped.flush(time.monotonic(), final=True)
                    return
                t0 = time.thread_time()  # CPU, not waiting on a slow terminal
                self.follower.pump()
                if self.grouped is not None:
                    self.grouped.flush(time.monotonic())
                busy = time.thread_time() - t0
                self._wake.wait(max(POLL_S, busy * REST_PER_BUSY))
                self._wake.clear()
        except OSError:
            self.broken = True

    def _handle_inbox(self) -> None:
        while True:
            try:
                kind, text, path = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add" and path is not None and self.grouped is not None:
                self.grouped.know(key_of(path))  # grouped by rank, labelled [0-3]
                self.follower.add(key_of(path), path)
            elif kind == "add" and path is not None:
                self.follower.add(text, path)
            elif kind == "say":
                self.follower.pump()
                if self.grouped is not None:
                    self.grouped.flush(time.monotonic(), final=True)
                self.err.write(b"treb: " + inert(text.encode(errors="replace")) + b"\n")
