"""`treb logs --dedup`: a line that several ranks print at about the same time, shown once
with its ranks (`[0-7] loading checkpoint`); the per-rank files are only read.

Lines are grouped by their text: a rank's line joins the oldest open group of the same text
that this rank is not in yet (so the k-th `epoch done` of each rank goes together), while
the group is open. Following (`-f`), "about the same time" is the time the view read the
lines: a group stays open until every rank is in it, or until a read that began more than
`WINDOW_S` seconds after the group opened found nothing more for it (so a view that stalled,
on a loaded machine, does not split a line its ranks printed together). Reading files
that are already written, where no line has a time, it is their order: the ranks' logs
are merged by how far into its file each line is (a rank that printed ten times more
still meets the others at its start and end), and a group stays open until every rank
joined or `PENDING_MAX` newer groups pushed it out. Groups go out in the order they
opened; the prefix is the ranks as compact ranges (`[0-3,6]`; `[n0-1]` for node logs).
"""

from __future__ import annotations

import heapq
import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from trebuchet.runtime.lines import Splitter
from trebuchet.runtime.regular import open_regular
from trebuchet.view.follow import Out

WINDOW_S = 2.0
PENDING_MAX = 10_000
READ = 1 << 20


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> `0-3,6`."""
    out: list[str] = []
    nums = sorted(set(numbers))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def label(keys: list[str]) -> str:
    """Keys `3` (rank 3) and `n1` (node 1's log) -> `0-3` / `n0-1` / `0-1,n0`."""
    ranks = [int(k) for k in keys if k.isdigit()]
    nodes = [int(k[1:]) for k in keys if k.startswith("n") and k[1:].isdigit()]
    parts = ([ranges(ranks)] if ranks else []) + ([f"n{ranges(nodes)}"] if nodes else [])
    return ",".join(parts)


class _Group:
    __slots__ = ("text", "keys", "opened")

    def __init__(self, text: bytes, key: str, opened: float) -> None:
        self.text = text
        self.keys = [key]
        self.opened = opened


class Dedup:
    """Lines of many ranks in; one prefixed line per group out (see the module's docstring).
    `window`: seconds a group stays open (None: by order alone, for written files)."""

    def __init__(self, out: Out, keys: list[str], window: float | None = WINDOW_S) -> None:
        self.out = out
        self.keys = set(keys)
        self.all = len(self.keys)
        self.window = window
        self.groups: OrderedDict[int, _Group] = OrderedDict()  # open, by when they opened
        self.by_text: dict[bytes, list[int]] = {}
        self.seq = 0
        self.read_from: float | None = None  # when the reads since the last flush began

    def know(self, key: str) -> None:
        """One more rank whose lines come (a log found later): a group is whole with it."""
        self.keys.add(key)
        self.all = len(self.keys)

    def add(self, key: str, lines: list[bytes], now: float) -> None:
        """Lines read at `now`; whole groups go out, those due by time at the next `flush`
        (the read under way may still bring a rank's line)."""
        for line in lines:
            self._add(key, line, now)
        self._emit(final=False, timed=False)

    def _add(self, key: str, text: bytes, now: float) -> None:
        for seq in self.by_text.get(text, ()):
            g = self.groups[seq]
            if key not in g.keys:  # an open group: not out yet
                g.keys.append(key)
                return
        self.seq += 1
        self.groups[self.seq] = _Group(text, key, now)
        self.by_text.setdefault(text, []).append(self.seq)

    def follow(self, now: float) -> None:
        """From order to time: what is still open waits `WINDOW_S` from `now` for the
        ranks not in it yet (a line one rank wrote just before the view started)."""
        self.window = WINDOW_S
        for g in self.groups.values():
            g.opened = now
        self.flush(now)

    def flush(self, now: float, final: bool = False) -> None:
        """After a read (`now`: the time after it): what is due (final: everything) goes
        out. By time, a group is due once a read that began after its window found nothing
        for it: the reads since this flush begin after `now`."""
        self._emit(final, timed=True)
        self.out.flush()
        self.read_from = now

    def _closed(self, g: _Group, timed: bool) -> bool:
        if len(g.keys) >= self.all:
            return True
        if self.window is not None:
            if not timed:
                return False
            return self.read_from is not None and self.read_from - g.opened > self.window
        return len(self.groups) > PENDING_MAX

    def _emit(self, final: bool, timed: bool) -> None:
        chunk: list[bytes] = []
        while self.groups:
            seq, g = next(iter(self.groups.items()))
            if not final and not self._closed(g, timed):
                break
            del self.groups[seq]
            same = self.by_text[g.text]
            same.remove(seq)
            if not same:
                del self.by_text[g.text]
            chunk.append(b"[%s] %s" % (label(g.keys).encode(), g.text))
        if chunk:
            self.out.write(b"\n".join(chunk) + b"\n")


def key_of(path: Path) -> str:
    """rank-3.log -> `3`; node-1.log -> `n1`."""
    kind, _, num = path.stem.partition("-")
    return num if kind == "rank" else f"n{num}"


def _lines(path: Path, start: int, ends: list[int], n: int) -> Iterator[tuple[float, int, bytes]]:
    """(how far into the file, n, line) from `start` to the end as it is now; `ends[n]`:
    the offset after the last whole line (a partial one is left for a follower)."""
    try:
        fh = open_regular(path)  # a FIFO or device is never read (regular.py)
    except OSError:
        return
    with fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(start)
        split = Splitter()
        pos = start
        while pos < size:
            data = fh.read(min(READ, size - pos))
            if not data:
                break
            lines = split.feed(data)
            pos += len(data)
            ends[n] = pos - split.partial_len
            for i, line in enumerate(lines):
                yield (pos - len(data) + (i + 1) * len(data) / len(lines)) / max(size, 1), n, line


def written(
    out: Out,
    files: list[tuple[Path, int]],
    follow_at: float | None = None,
    expect: list[str] | None = None,
) -> tuple[list[int], Dedup]:
    """Files as they are now (`(path, offset to start at)`), merged by position, grouped;
    the offsets read to, and the grouper. Not following (`follow_at` None): a last partial
    line too, and every group goes out. Following: only whole groups go out; the others
    stay open `WINDOW_S` from `follow_at` for the ranks that have not printed them yet;
    `expect`: keys whose logs are still to come (a group is whole with them)."""
    keys = [key_of(p) for p, _ in files]
    dedup = Dedup(out, keys + (expect or []), window=None)
    ends = [start for _, start in files]
    streams = [_lines(path, start, ends, n) for n, (path, start) in enumerate(files)]
    for _frac, n, line in heapq.merge(*streams):
        dedup.add(keys[n], [line], 0.0)
    if follow_at is None:
        for n, (path, _) in enumerate(files):
            rest = _partial(path, ends[n])
            if rest:
                dedup.add(keys[n], [rest], 0.0)
        dedup.flush(0.0, final=True)
        return ends, dedup
    dedup.follow(follow_at)
    return ends, dedup


def _partial(path: Path, offset: int) -> bytes:
    """A last line without its line end (the rank's last words), as a display line."""
    try:
        fh = open_regular(path)
    except OSError:
        return b""
    with fh:
        fh.seek(offset)
        data = fh.read(READ)
    split = Splitter()
    return b" ".join(split.feed(data) + split.flush())
