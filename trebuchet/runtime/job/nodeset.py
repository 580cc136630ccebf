"""Which nodes an attempt runs on, decided once for every engine: the first `nodes` good ones
of those the run holds, fewer down to `min_nodes` once too many were lost.

A lost or unhealthy node is excluded for the rest of the run in the run directory's
`excluded-nodes`, so a requeued Slurm job or a restarted controller reads the same.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ..rundir.records import write_text
from ..rundir.regular import read_text

EXCLUDED = "excluded-nodes"


class Choice(NamedTuple):
    """The hosts in the holder's order (the first is the master), or why none."""

    hosts: list[str]
    why_not: str  # "" when hosts is the attempt's


def excluded(run_dir: str) -> dict[str, str]:
    try:
        lines = read_text(os.path.join(run_dir, EXCLUDED), 1 << 20).splitlines()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in lines:
        host, _, why = line.partition("\t")
        if host:
            out[host] = why
    return out


def exclude(run_dir: str, host: str, why: str) -> None:
    known = excluded(run_dir)
    if host in known:
        return
    known[host] = " ".join(why.split())  # one line
    text = "".join(f"{h}\t{w}\n" for h, w in known.items())
    write_text(os.path.join(run_dir, EXCLUDED), text)


def choose(held: list[str], bad: dict[str, str] | set[str], want: int, least: int) -> Choice:
    good = [h for h in held if h not in bad]
    if len(good) >= least:
        return Choice(good[:want], "")
    lost = ", ".join(h for h in held if h in bad) or "none"
    need = f"{least}" if least == want else f"at least {least}"
    return Choice([], f"{len(good)} good node(s) left of {len(held)} (excluded: {lost}); "
                      f"the run needs {need}")  # fmt: skip
