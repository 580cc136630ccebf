"""A lost node, said and recorded the same way by every engine's controller: its record
(read as the attempt's first failure, before its peers' ranks), the `node_lost` event,
and its exclusion for the rest of the run.

Over ssh the agent's heartbeat and last word travel on the session's stdout beside its log
copy: BEAT every BEAT_S, `ENDED <code>` once its records are written. A session that ends
without ENDED lost its agent (the connection dropped, the agent was killed).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from ..rundir.records import AFTER, append_event, cause, write_json
from . import nodeset

if TYPE_CHECKING:
    from ..contracts.schema import FirstFailure

LABEL = "node_lost"
BEAT = "treb-beat"  # the agent is alive (a line of its own on the session's stdout)
INTERRUPT = b"\x03"  # on a session's stdin (ssh): the controller got Ctrl+C (node/per_node.py)
ENDED = "treb-ended"  # `treb-ended <code>`: the agent's records are written, it exits
BEAT_S = 2.0  # as agent_link's: node_timeout (at least 5 s) is several of them


class EarlyBeat:
    """The heartbeat before the log copy starts (the health checks may take
    health_check_timeout): stopped before anything else writes the session's stdout."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="treb-beat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        line = f"{BEAT}\n".encode()
        while True:
            try:
                os.write(self.fd, line)
            except OSError:
                return
            if self.stopped.wait(BEAT_S):
                return

    def stop(self) -> None:
        """Bounded: a write blocked on a stalled session is left behind."""
        self.stopped.set()
        self.thread.join(1.0)


def silent(host: str, timeout: float, last_seen: float) -> str:
    seen = time.strftime("%H:%M:%S", time.localtime(last_seen))
    return f"{LABEL}: {host} (no heartbeat for {timeout:g}s, last seen {seen})"


def dropped(host: str, what: str) -> str:
    return f"{LABEL}: {host} ({what})"


def record(run_dir: str, attempt: int, node: int, host: str, message: str,
           last_seen: float, label: str = LABEL, after: bool = False) -> FirstFailure:  # fmt: skip
    """`after`: lost once the attempt had failed (the teardown): excluded, but never the
    cause (records.AFTER keeps every reader from taking it)."""
    rec = cause(label, 1, attempt, node=node, message=message, host=host)
    rec["ended_at"], rec["state"] = last_seen, "ENDED"
    if after:
        rec["after_first_failure"] = True
    write_json(os.path.join(run_dir, f"attempt-{attempt}", f"lost-{node}.json"), rec)
    nodeset.exclude(run_dir, host, message)
    append_event(run_dir, label, attempt=attempt, host=host, node=node, last_seen=last_seen,
                 message=message, **({AFTER: True} if after else {}))  # fmt: skip
    return rec


def next_nodes(run_dir: str, held: list[str], want: int, least: int | None) -> nodeset.Choice:
    return nodeset.choose(held, nodeset.excluded(run_dir), want, least or want)
