"""What one run directory says about its nodes, for their history across runs (nodes.py).

Everything here is read from files a rank can write, so nothing is trusted: a host name is
kept only when Slurm could have named a node so, never used as a path; a log is found by
the rank's number, never by a path a record gives. Any bytes give events or nothing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trebuchet.runtime.contracts.rank_env import HOSTLIST_ITEM, item_names
from trebuchet.runtime.rundir.records import (
    FIRST,
    append_event,
    attempt_records,
    first_failure,
    read_json,
)
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
_MARKED = re.compile(
    rb'"(?:node_lost|node_unhealthy|straggler|attempt_started|node_marks_ignored)"'
)
STARTED, IGNORED = "attempt_started", "node_marks_ignored"
SAID_MAX = 20  # hosts a node_marks_ignored event names (its count: all of them)
RECORD_MAX = 1 << 20  # bytes of an attempt.json read
BRACKETS_MAX = 8  # ranges in one hostlist item (Slurm's names have a few; each one recurses)


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


_PORTED = re.compile(r"\[([^\[\]]+)\](?::[0-9]{1,5})?|([^:\[\]]+):[0-9]{1,5}")


def node_name(value: Any) -> str | None:
    """The node a host names: an ssh host's `user@` and `:port` (`[host]:port`) left out,
    then valid_host. An IPv6 address (colons, no brackets) names no node."""
    if isinstance(value, str) and "@" in value:
        value = value.rsplit("@", 1)[1]
    if isinstance(value, str) and (m := _PORTED.fullmatch(value)):
        value = m[1] or m[2]
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


@dataclass
class RunNodes:
    """What one run directory says about its nodes."""

    marks: list[NodeEvent]
    started: dict[int, Any]  # each attempt's first attempt_started `hosts` (ssh's record)
    said: int = 0  # the most hosts a node_marks_ignored event of the run counted


def read_run(run_dir: Path, attempts: int = 1_000_000) -> RunNodes:
    """The run's marks, and what its events say of its nodes, in one read of events.jsonl.
    The first attempt_started of an attempt is the controller's (written before its ranks
    start): a later one for the same attempt is a rank's."""
    seen = RunNodes([], {})

    def marking() -> Iterator[dict[str, Any]]:
        for ev in marking_events(run_dir):
            kind = ev.get("event")
            if kind == STARTED:
                a = _small_int(ev.get("attempt"))
                if a is not None and a < attempts:
                    seen.started.setdefault(a, ev.get("hosts"))
            elif kind == IGNORED:
                count = _small_int(ev.get("count"))
                seen.said = max(seen.said, count or 0)
            else:
                yield ev

    seen.marks = from_events(marking()) + from_failures(run_dir)
    return seen


def of_run(run_dir: Path) -> list[NodeEvent]:
    """Every node mark one run directory holds."""
    return read_run(run_dir).marks


_HOSTLIST = re.compile(f"{HOSTLIST_ITEM}(?:,{HOSTLIST_ITEM})*")


def hostlist(expr: Any, limit: int) -> list[str]:
    """The first `limit` node names of a Slurm hostlist (`tn1,tn[3-5,7]`, as attempt.json
    keeps the nodes); never more are made: a rewritten record may say tn[1-999999999].
    What is no hostlist of node names gives none."""
    if not isinstance(expr, str) or len(expr) > RECORD_MAX or not _HOSTLIST.fullmatch(expr):
        return []
    out: list[str] = []  # the first `limit` names, then those that name a node
    for item in re.findall(HOSTLIST_ITEM, expr):
        if item.count("[") > BRACKETS_MAX:
            continue
        for name in item_names(item):
            if len(out) >= limit:
                break
            out.append(name)
    return [name for name in out if valid_host(name)]


def ran_on(run_dir: Path, seen: RunNodes, attempt: int, width: int) -> set[str]:
    """The nodes an attempt ran on, as its records say: the ssh controller's attempt_started
    (`hosts`), else the Slurm controller's attempt-<n>/attempt.json (`nodes`). At most the
    run's `width` nodes (its index row's), the first named: a record rewritten by a rank
    widens it no further."""
    hosts = seen.started.get(attempt)
    if isinstance(hosts, list):
        names = [n for h in hosts[:width] if (n := node_name(h))]
    else:
        rec = read_json(str(run_dir / f"attempt-{attempt}" / "attempt.json"), RECORD_MAX)
        names = hostlist(rec.get("nodes") if isinstance(rec, dict) else None, width)
    return set(names)


def scoped(run_dir: Path, seen: RunNodes, marks: list[NodeEvent], attempts: int,
           width: int) -> tuple[list[NodeEvent], list[NodeEvent]]:  # fmt: skip
    """The marks on nodes their attempt ran on (a mark with no attempt: any attempt of the
    run), and the others: a rank can write a mark for any host, and one run must not take
    more nodes out than it held. `attempts`: those that started; the records of the others
    are a rank's."""
    held: dict[int, set[str]] = {}

    def hosts(a: int) -> set[str]:
        if a not in held:
            held[a] = ran_on(run_dir, seen, a, width) if a < attempts else set()
        return held[a]

    kept: list[NodeEvent] = []
    ignored: list[NodeEvent] = []
    for ev in marks:
        if ev.attempt is not None:
            names = hosts(ev.attempt)
        else:
            names = set().union(*(hosts(a) for a in range(min(attempts, 1000))))
        node = same_node(ev.host, names)
        if node is None:
            ignored.append(ev)
        else:
            kept.append(ev if node == ev.host else replace(ev, host=node))
    return kept, ignored


def same_node(host: str, names: set[str]) -> str | None:
    """The one of `names` that `host` is: itself, or the same machine by its short or its
    full name (a rank's uname says tn1.cluster.example where Slurm's NodeName is tn1, or
    an ssh host is listed by its FQDN): the name the run's records give it, which Slurm's
    --exclude and the ssh hosts take. An address is no name (10.0.0.1 is not 10.0.0.2)."""
    if host in names:
        return host
    short = host.split(".", 1)[0]
    if short.isdigit():
        return None
    found = [n for n in names if n == short or (n.split(".", 1)[0] == host and "." in n)]
    return found[0] if len(found) == 1 else None


def say_ignored(run_dir: Path, ignored: list[NodeEvent], said: int) -> None:
    """Once in the run's events: the hosts whose marks did not count (more of them than
    said before; the first SAID_MAX named)."""
    hosts = sorted({ev.host for ev in ignored})
    if len(hosts) <= said:
        return
    why = ("marks of nodes the run's records do not name among its attempts' nodes: not "
           "counted (docs/nodes.md)")  # fmt: skip
    with contextlib.suppress(OSError):  # another user's run, a full disk: not said
        append_event(str(run_dir), IGNORED, count=len(hosts), hosts=hosts[:SAID_MAX], why=why)
