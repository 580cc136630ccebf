"""Is the attempt hung? One decision for the local supervisor and the Slurm controller.

The run is hung when no rank made progress (a log line, a heartbeat: runtime/watch/activity.py)
for `hang_timeout` seconds: the newest progress of any rank counts, so a rank that is
silent while the others progress (many programs print from rank 0 only) does not make a
run hung. Before any progress, the attempt's start counts.

On a hang the watcher asks every agent for its ranks' stacks (runtime/watch/stacks.py), waits
for them (bounded), writes `attempt-<n>/hang.json` (the figures, which ranks answered)
and says so; what to do then (on_hang: fail, retry, warn) is the caller's, since stopping
differs per engine. With warn, it watches again once some rank progresses.

The watch also keeps each rank's habit (`Habits`: how often its progress advanced, since
when, its usual gap) and writes it into hang.json, so that the diagnosis judges a rank's
silence against its own pace: under the HF Trainer only rank 0 prints, and rank 1, silent
since its start, did not go "silent first" (diagnose/hang.py).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..rundir.records import write_json
from . import stacks
from .activity import HEARTBEAT_SUFFIX, progress_dir

if TYPE_CHECKING:
    from ..contracts.schema import Habit, Hang

CHECK_S = 1.0
# The action (teardown, retry) waits for the stacks at most this long after the hang is
# detected: each agent's dumps end within stacks.DUMP_DEADLINE_S (all ranks at once), and
# a stack that is not in by then is named missing in hang.json. Never longer.
STACKS_WAIT_S = 8.0


HABIT_KEEP = 64  # the progress times kept per rank: its usual gap is their median gap


def progress_times(adir: str) -> dict[str, float]:
    """Each rank's last progress ({rank-3: mtime of progress/rank-3})."""
    folder = progress_dir(adir)
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.endswith(HEARTBEAT_SUFFIX) or name.startswith("."):
            continue
        try:
            out[name] = os.stat(os.path.join(folder, name)).st_mtime
        except OSError:
            continue
    return out


def last_progress(adir: str, started: float) -> float:
    """The newest progress of any rank of the attempt (its start before any)."""
    return max([started, *progress_times(adir).values()])


class Habits:
    """Each rank's progress as the watch saw it (once a second): how many times it
    advanced, the first and last time, and the last HABIT_KEEP times (for its usual gap)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.count: dict[str, int] = {}
        self.first: dict[str, float] = {}

    def update(self, times: dict[str, float]) -> None:
        for name, t in times.items():
            seen = self.times.setdefault(name, [])
            if seen and t <= seen[-1]:
                continue
            seen.append(t)
            del seen[:-HABIT_KEEP]
            self.count[name] = self.count.get(name, 0) + 1
            self.first.setdefault(name, t)

    def record(self) -> dict[str, Habit]:
        """{name: {count, first, last, gap}} for hang.json (gap: the median gap between
        its progress times, None before two)."""
        out: dict[str, Habit] = {}
        for name, seen in self.times.items():
            gaps = sorted(b - a for a, b in zip(seen, seen[1:]))
            gap = gaps[len(gaps) // 2] if gaps else None
            out[name] = {"count": self.count[name], "first": self.first[name],
                         "last": seen[-1], "gap": gap}  # fmt: skip
        return out


def is_hung(last: float, timeout: float, now: float) -> bool:
    """The rule itself: no rank progressed for `timeout` seconds."""
    return now - last >= timeout


class HangWatch:
    """Steps of the deciding side's loop: watch, then request stacks, then decide."""

    def __init__(self, adir: str, timeout: float, action: str, expected: list[str],
                 started: float | None = None) -> None:  # fmt: skip
        self.adir = adir
        self.timeout = float(timeout)
        self.action = action  # fail | retry | warn
        self.expected = expected  # the stack files to wait for: rank-0, ..., or node-0
        self.started = time.time() if started is None else started
        self.next_check = 0.0
        self.rid: str | None = None
        self.info: Hang = {}
        self.stacks_deadline = 0.0
        self.warned_at: float | None = None  # warn: watching again after progress
        self.habits = Habits()

    def step(self) -> Hang | None:
        """None, or once per hang the hang's record (written to hang.json) when its stacks
        are in (or the wait for them is over)."""
        mono = time.monotonic()
        if self.rid is not None:
            got = stacks.answered(self.adir, self.rid)  # other nodes' ranks, in a shared dir
            if all(n in got for n in self.expected) or mono >= self.stacks_deadline:
                return self._decided(got)
            return None
        if mono < self.next_check:
            return None
        self.next_check = mono + CHECK_S
        now = time.time()
        times = progress_times(self.adir)
        self.habits.update(times)
        last = max([self.started, *times.values()])
        if self.warned_at is not None:
            if last <= self.warned_at:
                return None  # still the hang already reported
            self.warned_at = None
        if not is_hung(last, self.timeout, now):
            return None
        self.info = {
            "attempt_dir": self.adir, "hang_timeout": self.timeout, "action": self.action,
            "last_progress": last, "detected_at": now, "expected": self.expected,
            "habits": self.habits.record(),
        }  # fmt: skip
        self.rid = stacks.request(self.adir)
        self.info["stacks_requested_at"] = time.time()
        self.stacks_deadline = mono + STACKS_WAIT_S
        return None

    def _decided(self, got: dict[str, str]) -> Hang:
        info: Hang = {**self.info, "stacks_at": time.time(), "stacks": sorted(got),
                      "missing_stacks": [n for n in self.expected if n not in got]}  # fmt: skip
        write_json(os.path.join(self.adir, "hang.json"), info)
        self.rid = None
        self.warned_at = info["detected_at"]
        return info


def expected_names(launcher: str, nodes: int, ppn: int) -> list[str]:
    """The stack files of a whole attempt: one per rank, or per node under `none`."""
    if launcher == "none":
        return [f"node-{n}" for n in range(nodes)]
    return [f"rank-{r}" for r in range(nodes * ppn)]


def describe(info: Hang) -> str:
    """One line for a log: 'no rank made progress for 21s (hang_timeout 20s); stacks of
    4/4 ranks in attempt-0/stacks'."""
    silent = info["detected_at"] - info["last_progress"]
    want = info.get("expected", [])
    got = len([n for n in info.get("stacks", []) if n in want])
    where = os.path.join(info["attempt_dir"], stacks.STACKS_DIR)
    limit = float(info["hang_timeout"])
    return (f"hang: no rank made progress for {silent:.0f}s (hang_timeout {limit:g}s); "
            f"stacks of {got}/{len(want)} ranks in {where}")  # fmt: skip
