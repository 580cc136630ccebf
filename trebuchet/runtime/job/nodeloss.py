"""A lost node, said and recorded the same way by every engine's controller (ssh, local;
Slurm's writes the same record): the cause's words, `attempt-<n>/lost-<node>.json` (which
the rest of trebuchet reads as the attempt's first failure: records.first_failure puts a
lost node before its peers' ranks), the `node_lost` event, and the node's exclusion for
the rest of the run (nodeset.exclude), so the next attempt never picks it again.

Over ssh the node agent's heartbeat and last word travel on the session's stdout, where
the agent's log copy already goes (runtime/node/logcopy.py writes them): BEAT every BEAT_S
while the agent lives, `ENDED <code>` once its records are written. A session whose
process ends without ENDED lost its agent (the connection dropped, the agent was killed).

Stdlib only, Python >= 3.8 (runtime file).
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
    """The agent's heartbeat before its log copy starts (the secrets' line, the health
    checks, which may run the spec's own check for up to health_check_timeout): a thread
    of its own, stopped (and joined) before anything else writes the session's stdout."""

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
        """Bounded: a write blocked on a stalled session (its reader stopped) is left
        behind rather than holding the agent up."""
        self.stopped.set()
        self.thread.join(1.0)


def silent(host: str, timeout: float, last_seen: float) -> str:
    """`node_lost: ts2 (no heartbeat for 10s, last seen 12:01:07)`."""
    seen = time.strftime("%H:%M:%S", time.localtime(last_seen))
    return f"{LABEL}: {host} (no heartbeat for {timeout:g}s, last seen {seen})"


def dropped(host: str, what: str) -> str:
    """`node_lost: ts2 (<what the engine saw>)`: the engine said the node is gone."""
    return f"{LABEL}: {host} ({what})"


def record(run_dir: str, attempt: int, node: int, host: str, message: str,
           last_seen: float, label: str = LABEL, after: bool = False) -> FirstFailure:  # fmt: skip
    """The lost node on record (its file, the event) and excluded from this run; its
    record, the attempt's first failure unless `after`: the attempt had failed already
    (a node lost during the teardown), so the loss is known and excluded, but the cause
    stays the first failure's (records.AFTER keeps every reader from taking it)."""
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
    """The next attempt's nodes: the held ones not excluded, `want`, down to `least`."""
    return nodeset.choose(held, nodeset.excluded(run_dir), want, least or want)
