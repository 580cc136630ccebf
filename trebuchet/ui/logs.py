"""A rank's log as server-sent events: the last lines, then what is written, until the run
ends. Reads are bounded (CHUNK per read; a backlog over SKIP_OVER is skipped with a note),
lines are made inert (runtime/watch/display_lines.py) and sent as text: the page shows them with
textContent, never as HTML. A log replaced by a FIFO or a device is not read
(runtime/rundir/regular.py): it would hold the server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.runtime.watch.display_lines import Splitter, inert
from trebuchet.view.follow import attempt_logs

CHUNK = 64 * 1024
START_BACK = 64 * 1024  # the first view: about the last 64 KiB of the file
SKIP_OVER = 4 * 1024 * 1024  # a reader further behind than this jumps to the end
POLL = 0.25


def log_files(run_dir: Path, attempt: int) -> list[str]:
    return [path.name for _, _, path in attempt_logs(run_dir / f"attempt-{attempt}")]


def _event(kind: str, text: str) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(text)}\n\n".encode()


async def follow(
    path: Path, active: Callable[[], bool], disconnected: Callable[[], Awaitable[bool]],
    running: bool = True,
) -> AsyncIterator[bytes]:  # fmt: skip
    """Events for one log file: `line` (JSON string) per line, `note` for gaps, `end` once
    the run has ended and the file is read to its end (`running` False: the run had ended
    when the page asked, so the end comes as soon as the file is read)."""
    split = Splitter()
    offset: int | None = None
    checked_at = 0.0
    loop = asyncio.get_running_loop()
    while True:
        if await disconnected():
            return
        try:
            with open_regular(path) as fh:  # a FIFO or a device in its place is not read
                size = fh.seek(0, 2)
                if offset is None:
                    offset = max(0, size - START_BACK)
                    if offset:
                        fh.seek(offset)
                        offset += len(fh.readline())  # start on a whole line
                if size < offset:  # truncated: start again
                    offset = 0
                if size - offset > SKIP_OVER:
                    yield _event("note", f"[treb: {size - offset} bytes skipped]")
                    offset = size - START_BACK
                    split.reset()
                fh.seek(offset)
                data = fh.read(CHUNK)
        except OSError:  # not there (yet), or not a regular file
            data = b""
        if data:
            assert offset is not None  # set when the file was read
            offset += len(data)
            for line in split.feed(data):
                yield _event("line", inert(line).decode(errors="replace"))
            continue  # more may be there already: read on before sleeping
        if loop.time() - checked_at > 1.0:
            checked_at = loop.time()
            was_running, running = running, await asyncio.to_thread(active)
            if not was_running:  # ended, and read once more after that: done
                for line in split.flush():
                    yield _event("line", inert(line).decode(errors="replace"))
                yield _event("end", "the run has ended")
                return
        await asyncio.sleep(POLL)
