"""`treb logs --dedup`: a line several ranks print at about the same time, shown once with
its ranks (`[0-7] loading checkpoint`); the per-rank files are only read.

A rank's line joins the oldest open group of its text that the rank is not in yet (the
k-th `epoch done` of each rank goes together). Following, a group closes when every rank
joined or when a read begun `WINDOW_S` after it opened found nothing for it (a stalled view
does not split lines printed together); over written files, the ranks' logs merge by how
far into its file each line is, and a group closes once `PENDING_MAX` newer ones open.
A line finds its group in one step (`_Text`): walking the open groups was quadratic.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.runtime.watch.display_lines import Splitter
from trebuchet.view.follow import Out

WINDOW_S = 2.0
PENDING_MAX = 10_000
READ = 1 << 20
BATCH = 4096  # lines of one log handed to Dedup.add at a time (written logs)


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> `0-3,6`."""
    out: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(set(numbers))), lambda p: p[1] - p[0]):
        nums = [n for _, n in run]
        out.append(str(nums[0]) if len(nums) == 1 else f"{nums[0]}-{nums[-1]}")
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


class _Text:
    """The open groups of one text, oldest first, as absolute indexes (`base` is the first
    one still open). A rank joins the oldest it is not in, so the groups a rank is in are
    always the oldest ones: `next[key]`, the index of the first it is not in, finds its
    group in one step (walking the open groups made 40k repeats quadratic)."""

    __slots__ = ("base", "seqs", "next")

    def __init__(self) -> None:
        self.base = 0
        self.seqs: dict[int, int] = {}  # absolute index -> group seq
        self.next: dict[str, int] = {}


class Dedup:
    """Lines of many ranks in; one prefixed line per group out (see the module's docstring).
    `window`: seconds a group stays open (None: by order alone, for written files)."""

    def __init__(self, out: Out, keys: list[str], window: float | None = WINDOW_S) -> None:
        self.out = out
        self.keys = set(keys)
        self.all = len(self.keys)
        self.window = window
        self.groups: OrderedDict[int, _Group] = OrderedDict()  # open, by when they opened
        self.by_text: dict[bytes, _Text] = {}
        self.seq = 0
        self.read_from: float | None = None  # when the reads since the last flush began

    def know(self, key: str) -> None:
        """One more rank whose lines come (a log found later): a group is whole with it."""
        self.keys.add(key)
        self.all = len(self.keys)

    def add(self, key: str, lines: list[bytes], now: float) -> None:
        """Lines read at `now`; whole groups go out, those due by time at the next `flush`
        (the read under way may still bring a rank's line)."""
        chunk: list[bytes] = []
        for line in lines:
            self._add(key, line, now)
            if self.window is None:  # by order: PENDING_MAX counts after each line
                self._emit(chunk, final=False, timed=False)
        self._emit(chunk, final=False, timed=False)
        self._write(chunk)

    def _add(self, key: str, text: bytes, now: float) -> None:
        same = self.by_text.get(text)
        if same is None:
            same = self.by_text[text] = _Text()
        i = max(same.next.get(key, 0), same.base)  # the oldest open group without `key`
        same.next[key] = i + 1
        seq = same.seqs.get(i)
        if seq is not None:
            self.groups[seq].keys.append(key)
            return
        self.seq += 1
        self.groups[self.seq] = _Group(text, key, now)
        same.seqs[i] = self.seq

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
        chunk: list[bytes] = []
        self._emit(chunk, final, timed=True)
        self._write(chunk)
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

    def _emit(self, chunk: list[bytes], final: bool, timed: bool) -> None:
        while self.groups:
            seq, g = next(iter(self.groups.items()))
            if not final and not self._closed(g, timed):
                break
            del self.groups[seq]
            same = self.by_text[g.text]
            del same.seqs[same.base]  # groups go out in the order they opened
            same.base += 1
            if not same.seqs:
                del self.by_text[g.text]
            keys = g.keys[0] if len(g.keys) == 1 else label(g.keys)  # `3`, `n1`: as they are
            chunk.append(b"[%s] %s" % (keys.encode(), g.text))

    def _write(self, chunk: list[bytes]) -> None:
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
    batch: list[bytes] = []  # consecutive lines of one log: one add()
    last = -1
    for _frac, n, line in heapq.merge(*streams):
        if n != last or len(batch) >= BATCH:
            if batch:
                dedup.add(keys[last], batch, 0.0)
            batch, last = [], n
        batch.append(line)
    if batch:
        dedup.add(keys[last], batch, 0.0)
    if follow_at is not None:
        dedup.follow(follow_at)
        return ends, dedup
    for n, (path, _) in enumerate(files):
        rest = _partial(path, ends[n])
        if rest:
            dedup.add(keys[n], [rest], 0.0)
    dedup.flush(0.0, final=True)
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
