"""What one run directory says about its nodes, for their history across runs (nodes.py).

Everything here is read from files a rank can write, so nothing is trusted: a host name is
kept only when Slurm could have named a node so, never used as a path; a log is found by
the rank's number, never by a path a record gives. Any bytes give events or nothing.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trebuchet.runtime.rundir.records import FIRST, attempt_records, first_failure, read_json
from trebuchet.runtime.rundir.regular import open_regular

# Slurm's node names (and DNS's host names): letters, digits, `.`, `_`, `-`; not starting
# with `-` (never an option) nor `.`; no `[ ] ,` (a hostlist's), no space, no control byte.
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KINDS = ("lost", "unhealthy", "hardware", "straggler")
EVENT_KINDS = {"node_lost": "lost", "node_unhealthy": "unhealthy", "straggler": "straggler"}
# Hardware-like causes in a failing rank's log tail: the catalog (diagnose/catalog.py) has
# NCCL's connection errors and Slurm's node failure; ECC and Xid are the GPU's own words.
HARDWARE = (
    ("ecc", re.compile(r"uncorrectable ECC|ECC error|cudaErrorECCUncorrectable"
                       r"|ECC page retirement|[Rr]ow remapp\w* fail")),
    ("xid", re.compile(r"\bNVRM: Xid\b|\bXid \(PCI:|\bXid error")),
    ("gpu_lost", re.compile(r"GPU has fallen off the bus|cudaErrorDevicesUnavailable")),
    ("nccl", re.compile(r"ncclSystemError|ncclInternalError|ncclRemoteError"
                        r"|NCCL error[^\n]{0,200}(?:unhandled system error|unhandled cuda error"
                        r"|remote process exited|internal error)")),
    ("node_failure", re.compile(r"DUE TO NODE FAILURE|\bNODE_FAIL\b|Node failure on")),
)  # fmt: skip
LOG_TAIL = 64 * 1024  # of the failing rank's log: where its last words are
LINE_MAX = 1 << 20  # an event line longer than this is no node's mark (skipped unread)
_MARKED = re.compile(rb'"(?:node_lost|node_unhealthy|straggler)"')


@dataclass(frozen=True)
class NodeEvent:
    """One mark against a node. `key` is unique within its run, so that a run read again,
    or after a rebuild, counts once."""

    key: str
    host: str
    kind: str  # one of KINDS
    time: float
    detail: str = ""
    attempt: int | None = None  # as the run's files say: the index bounds it (nodes.py)


def valid_host(value: Any) -> str | None:
    """The host name when Slurm could name a node so, else None."""
    if isinstance(value, str) and HOST_RE.fullmatch(value) and ".." not in value:
        return value
    return None


def node_name(value: Any) -> str | None:
    """The node a host names: an ssh host's `user@` left out, then valid_host."""
    if isinstance(value, str) and "@" in value:
        value = value.rsplit("@", 1)[1]
    return valid_host(value)


def _time(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and v > 0 else None


def _small_int(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value < 1_000_000 else None


def from_events(events: Iterable[dict[str, Any]]) -> list[NodeEvent]:
    """The node marks in a run's events: a lost or unhealthy node once per attempt, a
    straggler once per run (a rank that stays slow is one mark, however often said)."""
    out: dict[str, NodeEvent] = {}
    for ev in events:
        kind = EVENT_KINDS.get(ev.get("event"))  # type: ignore[arg-type]
        host, when = node_name(ev.get("host")), _time(ev.get("time"))
        if kind is None or host is None or when is None:
            continue
        attempt = _small_int(ev.get("attempt"))
        key = f"{kind}:{host}" if kind == "straggler" else f"{kind}:{attempt}:{host}"
        if key not in out:
            detail = f"attempt {attempt}" if attempt is not None else ""
            out[key] = NodeEvent(key, host, kind, when, detail, attempt)
    return list(out.values())


def tail(path: Path, limit: int = LOG_TAIL) -> str:
    """The last `limit` bytes of a regular file, as text; '' when unreadable (a FIFO)."""
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - limit))
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def hardware_cause(text: str) -> str | None:
    for name, pattern in HARDWARE:
        if pattern.search(text):
            return name
    return None


def from_failures(run_dir: Path) -> list[NodeEvent]:
    """A mark against the host of each attempt's first failing rank whose log shows a
    hardware-like cause."""
    out = []
    try:
        names = os.listdir(run_dir)
    except OSError:
        return []
    for name in names:
        n = name[len("attempt-") :]  # ASCII digits only: str.isdigit() takes '²', int() not
        if not name.startswith("attempt-") or not re.fullmatch(r"[0-9]{1,6}", n):
            continue
        adir = run_dir / name
        ff = read_json(str(adir / FIRST)) or first_failure(attempt_records(str(adir)))
        if not isinstance(ff, dict):
            continue
        host, rank = node_name(ff.get("host")), _small_int(ff.get("rank"))
        when = _time(ff.get("ended_at"))
        if host is None or rank is None or when is None:
            continue
        found = hardware_cause(tail(adir / f"rank-{rank}.log"))
        if found:
            out.append(NodeEvent(f"hardware:{int(n)}", host, "hardware", when,
                                 f"attempt {int(n)}, rank {rank}: {found}", int(n)))  # fmt: skip
    return out


def marking_events(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The events.jsonl lines that may be a node's mark, a line at a time: a rank can fill
    the file (a GiB of it must not be held at once)."""
    try:
        fh = open_regular(run_dir / "events.jsonl")
    except OSError:
        return
    with fh:
        while line := fh.readline(LINE_MAX):
            if not line.endswith(b"\n") and len(line) == LINE_MAX:
                while (rest := fh.readline(LINE_MAX)) and not rest.endswith(b"\n"):
                    pass  # the rest of a line too long to be a mark
                continue
            if not _MARKED.search(line):
                continue
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(event, dict):
                yield event


def of_run(run_dir: Path) -> list[NodeEvent]:
    """Every node mark one run directory holds."""
    return from_events(marking_events(run_dir)) + from_failures(run_dir)
