"""Shared bits of the benchmarks: alternate timing of whole commands, medians, reports."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence


def time_cmd(
    argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> float:
    """Wall seconds of one command; it must succeed."""
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.decode()[-2000:]}"
        )
    return elapsed


def alternate(
    cmds: dict[str, Sequence[str]], repeats: int, env: dict[str, str], cwd: str | None = None
) -> dict[str, list[float]]:
    """Run each command once per round, in turn, so machine noise hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for argv in cmds.values():  # warm caches once, untimed
        time_cmd(argv, env, cwd)
    for _ in range(repeats):
        for name, argv in cmds.items():
            times[name].append(time_cmd(argv, env, cwd))
    return times


def wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    """Until cond() is true, polled every 50 ms; exits naming `what` after `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> str:
    return f"{os.cpu_count()} cpus, {os.uname().sysname} {os.uname().release}"
