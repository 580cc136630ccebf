"""Is the attempt hung? One decision for every engine's controller.

Hung: no rank made progress for `hang_timeout` seconds. The newest progress of ANY rank
counts: many programs print from rank 0 only. On a hang the watch asks for every rank's
stacks, waits for them (bounded) and writes hang.json; acting on it is the caller's, as
stopping differs per engine. Each rank's habit goes into hang.json too, so the diagnosis
judges a rank's silence against its own pace (diagnose/hang.py).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..rundir.records import write_json
from . import paths, stacks
from .activity import HEARTBEAT_SUFFIX, progress_dir

if TYPE_CHECKING:
    from ..contracts.schema import Habit, Hang

CHECK_S = 1.0
STACKS_WAIT_S = 8.0  # past stacks.DUMP_DEADLINE_S: a stack not in by then is named missing


HABIT_KEEP = 64  # the progress times kept per rank: its usual gap is their median gap


def progress_times(adir: str) -> dict[str, float]:
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
    return max([started, *progress_times(adir).values()])


class Habits:
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
        out: dict[str, Habit] = {}
        for name, seen in self.times.items():
            gaps = sorted(b - a for a, b in zip(seen, seen[1:]))
            gap = gaps[len(gaps) // 2] if gaps else None
            out[name] = {"count": self.count[name], "first": self.first[name],
                         "last": seen[-1], "gap": gap}  # fmt: skip
        return out


def is_hung(last: float, timeout: float, now: float) -> bool:
    return now - last >= timeout


class HangWatch:
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
        """Once per hang its record, when its stacks are in (or the wait for them is over)."""
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
    if launcher == "none":
        return [f"node-{n}" for n in range(nodes)]
    return [f"rank-{r}" for r in range(nodes * ppn)]


def describe(info: Hang) -> str:
    silent = info["detected_at"] - info["last_progress"]
    want = info.get("expected", [])
    got = len([n for n in info.get("stacks", []) if n in want])
    where = os.path.join(info["attempt_dir"], paths.STACKS_DIR)
    limit = float(info["hang_timeout"])
    return (f"hang: no rank made progress for {silent:.0f}s (hang_timeout {limit:g}s); "
            f"stacks of {got}/{len(want)} ranks in {where}")  # fmt: skip
