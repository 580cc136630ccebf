"""One host's session of an ssh attempt (Node), and what an attempt left: each node's
attempt folder fetched from its host, the attempt's state and root cause.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from trebuchet.backends.ssh.script import (
    SESSION,
    SETUP_DONE,
    SETUP_FAILED,
    SETUP_OUTPUT,
    SETUP_TAIL,
    SshFacts,
)
from trebuchet.runtime.job import nodeloss
from trebuchet.runtime.node import barrier
from trebuchet.runtime.rundir.records import cause, first_failure

if TYPE_CHECKING:
    from trebuchet.backends.ssh.hosts import Hosts
    from trebuchet.runtime.contracts.schema import FirstFailure, Outcome

LOST = "connection lost"
BEAT_LINE = nodeloss.BEAT.encode()
ENDED_LINE = nodeloss.ENDED.encode() + b" "
HEALTHY_LINE = barrier.HEALTHY.encode()
STALL_S = 3.0  # a gap between two polls this long: this process was stopped, not the nodes


def merge_hang(adir: Path, expected: list[str]) -> bool:
    """Whether a node's hang watch stopped the attempt. Its hang.json then covers every rank
    whose stacks came back, from any node: the diagnosis sees the whole run."""
    from trebuchet.store.files import read_json, write_json

    info = read_json(adir / "hang.json")
    if not isinstance(info, dict) or info.get("action") == "warn":
        return False
    stacks = sorted(p.stem for p in (adir / "stacks").glob("*.txt"))
    write_json(adir / "hang.json", {**info, "expected": expected, "stacks": stacks})
    return True


class Node:
    """One host's session of one attempt (the node agent's, or a pre/post command's)."""

    def __init__(self, index: int, host: str, proc: subprocess.Popen, log: IO[bytes],
                 hook: bool = False) -> None:  # fmt: skip
        self.index, self.host, self.proc, self.log, self.hook = index, host, proc, log, hook
        self.returncode: int | None = None
        self.closed = False
        self.reader: threading.Thread | None = None
        self.pgid: int | None = None  # the session's process group on its host
        self.setup_done = False  # the agent (or the pre/post command) took the session over
        self.setup_failed: tuple[int, int] | None = None  # (ssh.setup item from 1, exit code)
        self.setup_output: list[str] = []  # the last lines setup printed, when it failed
        self.signalled: set[str] = set()  # the remote stops sent (TERM, KILL)
        self.heard = time.monotonic()  # the agent's last line (its heartbeat: nodeloss.BEAT)
        self.heard_wall = time.time()
        self.ended: int | None = None  # the agent's last word (nodeloss.ENDED), its code
        self.lost_cause: FirstFailure | None = None  # this node was lost (nodeloss.record)
        self.healthy = False  # its agent's checks passed; it waits for the go (barrier.py)

    def send(self, line: bytes) -> None:
        """A line to the agent on its session's stdin (gone: its exit code says so)."""
        if not self.closed and self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(line)
                self.proc.stdin.flush()

    def close_session(self, interrupt: bool = False) -> None:
        """Close stdin: the remote agent stops its ranks and ends. `interrupt` (Ctrl+C):
        INTERRUPT first, so that it stops them as torchrun does (SIGINT first)."""
        if not self.closed and self.proc.stdin:
            self.closed = True
            with contextlib.suppress(OSError):
                if interrupt and self.setup_done and not self.hook:
                    self.proc.stdin.write(nodeloss.INTERRUPT)
                    self.proc.stdin.flush()
                self.proc.stdin.close()

    @property
    def lost(self) -> bool:
        """The session ended without its agent's end: the connection dropped (ssh exit 255,
        the client killed), or the agent died after setup without its last word."""
        if self.setup_failed is not None or self.returncode is None or self.ended is not None:
            return False
        gone = self.returncode == 255 or self.returncode < 0
        return gone or (self.setup_done and not self.hook)

    def hear(self, line: bytes) -> bool:
        """A line from the agent: it is alive; False for what goes on to the logs."""
        self.heard, self.heard_wall = time.monotonic(), time.time()
        if line.startswith(BEAT_LINE):
            return line.rstrip(b"\r\n") == BEAT_LINE
        if line.rstrip(b"\r\n") == HEALTHY_LINE:
            self.healthy = True
            return True
        if line.startswith(ENDED_LINE):
            code = line[len(ENDED_LINE) :].strip()
            if code.lstrip(b"-").isdigit():
                self.ended = int(code)
                return True
        return False

    def marker(self, line: bytes) -> bool:
        """A line of the session's script (before the agent): taken in; False otherwise."""
        word, _, rest = line.decode(errors="replace").rstrip("\r\n").partition(" ")
        if word == SESSION and rest.isdigit():
            self.pgid = int(rest)
        elif word == SETUP_DONE:
            self.setup_done = True
            self.heard, self.heard_wall = time.monotonic(), time.time()
        elif word == SETUP_FAILED:
            item, _, code = rest.partition(" ")
            self.setup_failed = (int(item), int(code)) if (item + code).isdigit() else (0, 1)
        elif word == SETUP_OUTPUT:
            self.setup_output = [*self.setup_output[-SETUP_TAIL + 1 :], rest]
        else:
            return False
        return True


def fetch(hosts: Hosts, node: Node, adir: Path) -> str | None:
    """The node's attempt folder from its host, into `adir`; what to say when it could not be."""
    remote = f"{hosts.info['remote_run_dir']}/{adir.name}"
    cmd = f"tar -C {shlex.quote(remote)} -cf - ."
    try:
        out = subprocess.run(hosts.ssh(node.host, cmd), capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        out = None
    if out is None or out.returncode != 0:
        return f"{node.host}: the attempt's records could not be fetched"
    from trebuchet.store.files import write_atomic_bytes

    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if not member.isfile() or not re.fullmatch(
                r"((stacks|metrics|marks)/)?[\w.-]+", name
            ):  # the folder's files, stacks, metrics, marks (no paths from the host)
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            path = adir / name
            path.parent.mkdir(mode=0o700, exist_ok=True)
            if name.endswith(".log"):  # in place: a `treb logs -f` reader keeps its file
                with open(path, "ab") as fh:
                    fh.truncate(0)
                    fh.write(data)
            else:
                write_atomic_bytes(path, data)
    return None


def process_records(adir: Path, hosts: list[str]) -> list[Outcome]:
    """The records the agents wrote (fetched), each with its node's host."""
    from trebuchet.store.files import read_json

    records: list[Outcome] = []
    for path in sorted(adir.glob("*.json")):
        rec = read_json(path)
        if isinstance(rec, dict) and "label" in rec:
            node = int(rec.get("node") or 0)
            rec.setdefault("host", hosts[node] if node < len(hosts) else "?")
            records.append(cast("Outcome", rec))
    return records


def outcome(info: SshFacts, records: list[Outcome], first: Node | None, reason: str | None,
            adir: Path, attempt: int, hung: bool, one_launcher: bool,
            ) -> tuple[str, FirstFailure | None]:  # fmt: skip
    """The attempt's state and root cause (`first`: the first node to end badly;
    `one_launcher`: node 0's horovodrun ran every host's ranks)."""
    if reason == "cancel":
        return "CANCELLED", None
    if reason == "timeout":  # the controller's clock (setup, `pre`, a late agent)
        return "TIMEOUT", None
    if reason == "idle_gpu":  # the controller's idle-GPU rule stopped them (watch/gpu.py)
        return "FAILED", None
    if first is None:
        return ("FAILED" if reason == "post" else "SUCCEEDED"), None
    if first.setup_failed is not None:
        return "FAILED", setup_cause(info, first, adir, attempt)
    if first.lost_cause is not None:
        return "FAILED", {**first.lost_cause, "log": str(adir / f"ssh-{first.index}.log")}
    if first.lost:
        what = f"the ssh connection to {first.host} was lost (ssh exit {first.returncode})"
        log = str(adir / f"ssh-{first.index}.log")
        return "FAILED", cause(f"node {first.index}", 255, attempt, first.index,
                               host=first.host, log=log, message=what)  # fmt: skip
    mine = [r for r in records if (r.get("node") or 0) == first.index]
    if one_launcher:
        mine = records
    found = first_failure(mine) or first_failure(records)
    if first.returncode == 124 and found is None:
        return "TIMEOUT", None
    if found is None and hung:  # no rank failed: the hang watch stopped them
        return "FAILED", None
    if found is None:
        found = cause(f"node {first.index}", first.returncode or 1, attempt, first.index,
                      host=first.host)  # fmt: skip
    name = f"rank-{found['rank']}" if found.get("rank") is not None else f"node-{first.index}"
    return "FAILED", {**found, "attempt": attempt, "log": str(adir / f"{name}.log")}


def setup_text(info: SshFacts, n: Node) -> str:
    """'ssh.setup failed at job.yaml:9 (`source /x/activate`), exit code 1'."""
    assert n.setup_failed is not None
    item, code = n.setup_failed
    setup, where = info["setup"], info.get("setup_where") or []
    if not 1 <= item <= len(setup):
        return f"ssh.setup could not start (exit code {code})"
    text = setup[item - 1].strip().splitlines() or [""]
    shown = text[0] + (" ..." if len(text) > 1 else "")
    at = where[item - 1] if item <= len(where) else f"item {item}"
    if code == 0:  # `exit 0`: no rank would have run
        return f"ssh.setup ended the shell at {at} (`{shown}`) before the node agent started"
    return f"ssh.setup failed at {at} (`{shown}`), exit code {code}"


def setup_cause(info: SshFacts, n: Node, adir: Path, attempt: int) -> FirstFailure:
    """A node whose ssh.setup failed, with setup's log (fetched from the host; else the
    lines its session sent)."""
    assert n.setup_failed is not None
    log = adir / f"setup-node-{n.index}.log"
    if not log.is_file() and n.setup_output:
        log.write_text("".join(f"{line}\n" for line in n.setup_output))
    last = next((ln.strip() for ln in reversed(n.setup_output) if ln.strip()), "")
    what = f"{setup_text(info, n)} on {n.host} (node {n.index})" + (f": {last}" if last else "")
    code = n.setup_failed[1] or n.returncode or 1
    return cause("setup", code, attempt, n.index, host=n.host,
                 log=str(log if log.is_file() else adir / f"ssh-{n.index}.log"),
                 message=what)  # fmt: skip
