"""Stragglers: a rank whose steps stay slower than the other ranks' (docs/goodput.md).

In lockstep training every step ends in a collective that waits for the slowest rank, so
a step's END is the same on every rank; what differs is when each rank ARRIVES at it.
A rank says so with `trebuchet.dist.mark("compute", n)` before the collective: its time
for step n is its arrival less the step's start (the previous step's latest mark).
Without `compute` marks, the interval between its own step marks (or progress lines) is
used: exact where ranks do not wait for each other, equal where they do.

A rank's step score is its time over the median of the OTHER ranks' (leave-one-out: with
two ranks the median of both would halve the gap), each plus EPS (sub-millisecond noise
is no 2x); it is named once the median of its last WINDOW scores reaches the threshold,
and unnamed below halfway back to 1 (a threshold near 1 would flap).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import time
from typing import Any, Dict, List, Mapping, Sequence

from ..rundir.records import attempt_records, now, read_json, write_regular
from ..rundir.regular import open_fd
from . import marks as rmarks
from .paths import MARKS_DIR

COMPUTE = "compute"  # a rank's mark before its step's collective (its arrival)
THRESHOLD = 1.3  # straggler_threshold's default
WINDOW = 10  # steps a rank's score is the median over
MIN_STEPS = 5  # step scores a rank needs before it can be named
KEEP = WINDOW + 2  # steps of each rank kept by the watch
CHECK_S = 2.0  # the watch reads the marks at most this often
HUGE_S = 1e6  # a step time longer than this (11 days) is no step time
EPS = 1e-3  # seconds added to both sides of a ratio: the noise floor of a step time
READ_MAX = 256 << 10  # bytes of one marks file read per check, at most (1000s of steps)
CHECK_READ_MAX = 2 << 20  # bytes of all the marks files read per check, at most
RANKS_MAX = 16384  # ranks followed, at most
LINES_MAX = 4 * KEEP  # lines of a file parsed per check, its last: the steps the watch keeps
SHARE_MIN = 512  # ... but each file's share at least this (thousands of ranks: its end)
FILE = "stragglers.json"

Durations = Dict[str, List[float]]


def _fine(d: float) -> bool:
    return isinstance(d, (int, float)) and math.isfinite(d) and 0.0 <= d <= HUGE_S


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def step_scores(times: Mapping[str, Sequence[float | None]]) -> dict[str, list[float]]:
    ranks = list(times)
    length = max((len(v) for v in times.values()), default=0)
    out: dict[str, list[float]] = {r: [] for r in ranks}
    for i in range(length):
        known = []
        for r in ranks:
            v = times[r][i] if i < len(times[r]) else None
            if v is not None and _fine(v):
                known.append((float(v), r))
        if len(known) < 2:
            continue
        known.sort()
        values = [v for v, _ in known]
        for at, (d, r) in enumerate(known):
            out[r].append((d + EPS) / (_median_without(values, at) + EPS))
    return out


def _median_without(s: Sequence[float], at: int) -> float:
    """The median of the sorted `s` less its element `at`, in O(1): thousands of ranks."""
    m = len(s) - 1

    def pick(j: int) -> float:  # the j-th of the rest
        return s[j if j < at else j + 1]

    return pick(m // 2) if m % 2 else (pick(m // 2 - 1) + pick(m // 2)) / 2.0


def score(times: Mapping[str, Sequence[float | None]], window: int = WINDOW) -> dict[str, float]:
    return {r: _median(s[-window:]) for r, s in step_scores(times).items() if s}


def named(times: Mapping[str, Sequence[float | None]], threshold: float = THRESHOLD,
          min_steps: int = MIN_STEPS, window: int = WINDOW) -> dict[str, float]:  # fmt: skip
    found = step_scores(times)
    return {r: _median(s[-window:]) for r, s in found.items()
            if len(s) >= min_steps and _median(s[-window:]) >= threshold}  # fmt: skip


class Rank:
    """Step key -> time: the mark's number, else its count among the rank's marks of that kind."""

    def __init__(self) -> None:
        self.compute: dict[float, float] = {}
        self.step: dict[float, float] = {}
        self.counts = {COMPUTE: 0, rmarks.STEP: 0}

    def add(self, kind: str, t: float, n: float | None) -> None:
        if kind not in self.counts:
            return
        key = float(self.counts[kind]) if n is None else n
        self.counts[kind] += 1
        into = self.compute if kind == COMPUTE else self.step
        into.pop(key, None)  # a number used again (a new epoch's): the latest, last
        into[key] = t
        while len(into) > KEEP + 1:  # the keys marked longest ago go
            del into[next(iter(into))]


def durations(ranks: Mapping[str, Rank]) -> Durations:
    """Each rank's time for each of the last KEEP steps, aligned by step key (NaN: none)."""
    arrive = any(r.compute for r in ranks.values())
    first: dict[float, float] = {}  # each step key's earliest mark: steps in time order
    for r in ranks.values():
        for k, t in (r.compute if arrive else r.step).items():
            first[k] = min(t, first.get(k, t))
    keys = sorted(first, key=lambda k: (first[k], k))[-(KEEP + 1) :]
    start: float | None = None
    out: Durations = {name: [] for name in ranks}
    for prev, key in zip(keys, keys[1:]):
        if arrive:  # the previous step let the last rank go at its latest mark
            ends = [e for r in ranks.values() for e in (r.compute.get(prev), r.step.get(prev))
                    if e is not None]  # fmt: skip
            start = max(ends) if ends else None
        for name, r in ranks.items():
            if arrive:
                t1, t0 = r.compute.get(key), start
            else:
                t1, t0 = r.step.get(key), r.step.get(prev)
            d = t1 - t0 if t1 is not None and t0 is not None else math.nan
            out[name].append(d)
    return out


def rank_of(name: str) -> int | None:
    base = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    kind, _, num = base.partition("-")
    return int(num) if kind == "rank" and num.isdigit() and len(num) < 8 else None


class Reader:
    def __init__(self, path: str, points: bool) -> None:
        self.path, self.points = path, points
        self.offset = 0
        self.rest = b""
        self.last_read = 0  # bytes the last read took

    def read(self, limit: int = READ_MAX) -> list[rmarks.Mark]:
        self.last_read = 0
        try:
            fd = open_fd(self.path)
        except OSError:
            return []
        try:
            size = os.fstat(fd).st_size
            if size < self.offset:  # truncated: from the start again
                self.offset, self.rest = 0, b""
            if size - self.offset > limit:  # more than a check reads: its end
                self.offset, self.rest = size - limit, b""
            data = os.pread(fd, limit, self.offset) if size > self.offset else b""
        except OSError:
            return []
        finally:
            os.close(fd)
        self.offset += len(data)
        self.last_read = len(data)
        data = self.rest + data
        cut = data.rfind(b"\n") + 1
        self.rest = data[cut:][-4096:]  # a line in the making (a mark's line is short)
        whole = b"\n".join(data[:cut].rsplit(b"\n", LINES_MAX + 1)[-LINES_MAX - 1 :])
        return rmarks.parse_points(whole) if self.points else rmarks.parse_marks(whole)


class Folder:
    """Every rank's marks of one attempt, read incrementally. Only the job's `world` ranks
    count: files a rank wrote for ranks that do not exist are no peers (docs/goodput.md#trust)."""

    def __init__(self, adir: str, world: int | None = None) -> None:
        self.adir = adir
        self.world = world
        self.readers: dict[str, Reader] = {}
        self.ranks: dict[str, Rank] = {}

    def _scan(self) -> None:
        for sub, points in ((MARKS_DIR, False), ("metrics", True)):
            folder = os.path.join(self.adir, sub)
            for name in self._names(folder, points):
                key = f"{sub}/{name}"
                if key not in self.readers and len(self.readers) < 2 * RANKS_MAX:
                    self.readers[key] = Reader(os.path.join(folder, name), points)

    def _names(self, folder: str, points: bool) -> list[str]:
        """With `world` known, by name: a folder flooded with other names hides none."""
        ext = ".jsonl" if points else ""
        if self.world is not None:
            sub = os.path.basename(folder)
            names = [f"rank-{r}{ext}" for r in range(min(self.world, RANKS_MAX))]
            new = [n for n in names if f"{sub}/{n}" not in self.readers]
            return [n for n in new if os.path.lexists(os.path.join(folder, n))]
        try:
            with os.scandir(folder) as it:  # never the whole of a flooded folder
                found = [e.name for e in itertools.islice(it, rmarks.ENTRIES_MAX)]
        except OSError:
            return []
        return [n for n in found if rank_of(n) is not None and n.endswith(".jsonl") == points]

    def read(self) -> dict[str, Rank]:
        self._scan()
        share = max(SHARE_MIN, min(READ_MAX, CHECK_READ_MAX // max(1, len(self.readers))))
        for key, reader in self.readers.items():
            name = str(rank_of(key.rpartition("/")[2]))
            found = reader.read(share)
            if reader.points and f"{MARKS_DIR}/rank-{name}" in self.readers:
                continue  # the rank marks its steps: its log lines are not needed
            rank = self.ranks.setdefault(name, Rank())
            for m in found:
                rank.add(m.kind, m.t, m.n)
        return {n: r for n, r in self.ranks.items() if r.compute or r.step}


def node_scores(scores: Mapping[str, float], ppn: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for r, s in scores.items():
        node = str(int(r) // max(1, ppn))
        out[node] = max(out.get(node, 0.0), s)
    return out


def placed(adir: str, ranks: Sequence[str], scores: Mapping[str, Any], ppn: int) -> list[Any]:
    """The named ranks as their events say them: node and host from the attempt's records."""
    known: dict[str, tuple[int, str]] = {}
    for rec in attempt_records(adir):
        rank = rec.get("rank")
        if isinstance(rank, int):
            node = rec.get("node")
            known[str(rank)] = (node if isinstance(node, int) else rank // max(1, ppn),
                                str(rec.get("host") or ""))  # fmt: skip
    here = os.uname().nodename
    out = []
    for r in ranks:
        node, host = known.get(r, (int(r) // max(1, ppn), ""))
        out.append({"rank": int(r), "node": node, "host": host or here, "score": scores[r]})
    return out


def report(ranks: Mapping[str, Rank], threshold: float, ppn: int) -> dict[str, Any]:
    times = durations(ranks)
    scores = {r: round(s, 4) for r, s in score(times).items()}
    return {
        "time": round(now(), 3), "threshold": threshold,
        "ranks": scores, "nodes": {n: round(s, 4) for n, s in node_scores(scores, ppn).items()},
        "stragglers": sorted(named(times, threshold), key=int),
    }  # fmt: skip


def threshold_of(run_dir: str) -> float:
    conf = read_json(os.path.join(run_dir, "metrics.json"), 1 << 20)
    value = conf.get("straggler_threshold", THRESHOLD) if isinstance(conf, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return THRESHOLD
    try:
        value = float(value)  # a rank can rewrite metrics.json: an integer of 400 digits
    except OverflowError:
        return THRESHOLD
    return value if math.isfinite(value) and (value == 0 or value > 1) else THRESHOLD


class StragglerWatch:
    def __init__(self, adir: str, threshold: float, ppn: int, world: int | None = None) -> None:
        self.adir, self.threshold, self.ppn = adir, threshold, ppn
        self.folder = Folder(adir, world)
        self.next_check = time.monotonic() + CHECK_S
        self.current: set[str] = set()  # the ranks now named
        self.told: set[str] = set()  # the ranks an event named: once an attempt each
        self.written: dict[str, Any] = {}

    def check(self, force: bool = False) -> list[dict[str, Any]]:
        mono = time.monotonic()
        if mono < self.next_check and not force:
            return []
        ranks = self.folder.read()
        found = report(ranks, self.threshold, self.ppn) if len(ranks) >= 2 else None
        # thousands of ranks: a look costs at most 2 % of the controller's time
        self.next_check = time.monotonic() + max(CHECK_S, 50 * (time.monotonic() - mono))
        if found is None:
            return []
        leave = 1.0 + (self.threshold - 1.0) / 2.0
        new = [r for r in found["stragglers"] if r not in self.current | self.told]
        self.told.update(new)  # a threshold near 1 flaps: still one event, one webhook
        self.current = {r for r in self.current if found["ranks"].get(r, 0.0) >= leave}
        self.current.update(found["stragglers"])
        found["stragglers"] = sorted(self.current, key=int)
        if {k: v for k, v in found.items() if k != "time"} != self.written:
            self.written = {k: v for k, v in found.items() if k != "time"}
            write(self.adir, found)
        return placed(self.adir, new, found["ranks"], self.ppn) if new else []

    def step(self, records: Any, attempt: int, notifier: Any = None, force: bool = False) -> None:
        try:
            found = self.check(force)
        except Exception:  # noqa: BLE001 - a straggler's figure never ends the supervision
            return
        for f in found:
            records.event("straggler", attempt=attempt, **f)
            records.say(describe(f, self.threshold))
            if notifier is not None:
                notifier.event("straggler", "RUNNING", describe(f, self.threshold),
                               attempt=attempt, **f)  # fmt: skip


def printable(text: str) -> str:
    """A host name comes from a record, which a rank can write: no control reaches a terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def describe(f: Mapping[str, Any], threshold: float) -> str:
    return (f"straggler: rank {f['rank']} (node {f['node']}, {printable(str(f['host']))}) takes "
            f"{f['score']:.2f}x its peers' median step time (straggler_threshold "
            f"{threshold:g})")  # fmt: skip


def write(adir: str, data: Mapping[str, Any]) -> None:
    text = json.dumps(data, sort_keys=True) + "\n"
    with contextlib.suppress(OSError):
        write_regular(os.path.join(adir, FILE), text.encode(), truncate=True)


def watch(run_dir: str, adir: str, ppn: int, world: int | None = None) -> StragglerWatch | None:
    threshold = threshold_of(run_dir)
    return StragglerWatch(adir, threshold, ppn, world) if threshold else None


def _well_formed(data: object) -> bool:
    """Whether a stragglers.json is what `write` writes (a rank can write the file too)."""
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), dict):
        return False
    ranks, named_ = data["ranks"], data.get("stragglers")
    return (all(rank_of(f"rank-{r}") is not None and isinstance(s, (int, float))
                and not isinstance(s, bool) and math.isfinite(s) for r, s in ranks.items())
            and isinstance(named_, list) and all(isinstance(r, str) and r in ranks for r in named_)
            and isinstance(data.get("nodes", {}), dict))  # fmt: skip


def scores_of(adir: str, threshold: float = THRESHOLD, ppn: int = 1,
              world: int | None = None) -> dict[str, Any] | None:  # fmt: skip
    """stragglers.json, else computed now (after the fact: ssh runs whose marks were fetched)."""
    data = read_json(os.path.join(adir, FILE), 1 << 20)
    if _well_formed(data):
        return dict(data)
    ranks = Folder(adir, world).read()
    return report(ranks, threshold, ppn) if len(ranks) >= 2 else None


def summary(run_dir: str, attempt: int, ppn: int,
            world: int | None = None) -> dict[str, Any] | None:  # fmt: skip
    """An attempt's stragglers as `treb status --json`, top and the dashboard show them."""
    threshold = threshold_of(run_dir)
    if not threshold:
        return None
    adir = os.path.join(run_dir, f"attempt-{attempt}")
    data = scores_of(adir, threshold, ppn, world)
    if data is None:
        return None
    found = data.get("ranks")
    ranks: dict[str, Any] = found if isinstance(found, dict) else {}
    names = [str(r) for r in data.get("stragglers") or [] if str(r) in ranks]
    return {"attempt": attempt, "threshold": threshold, "ranks": ranks,
            "nodes": data.get("nodes") or {},
            "stragglers": placed(adir, names, ranks, ppn)}  # fmt: skip


def lines(data: Mapping[str, Any] | None) -> list[str]:
    if not data:
        return []
    return [describe(f, data["threshold"]) for f in data["stragglers"]]
