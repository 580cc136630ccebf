"""A run's start, in the index and in its own events at once: a rebuilt index
(store/rebuild.py) then knows the supervisor as the live one did (pid, start time, host),
so a reused pid is never taken for it. Every engine that supervises here calls this."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trebuchet.runtime.procs import hostname, start_time
from trebuchet.store.db import Store
from trebuchet.store.files import append_event
from trebuchet.store.states import RUNNING


def run_started(store: Store, run_id: str, run_dir: Path, **facts: Any) -> None:
    """RUNNING, supervised by this process; `facts` go into the event too (the cgroup)."""
    me = os.getpid()
    now = time.time()
    who: dict[str, Any] = {
        "supervisor_pid": me,
        "supervisor_start": start_time(me),
        "host": hostname(),
    }
    store.update_run(run_id, state=RUNNING, started_at=now, last_seen=now, **who)
    append_event(run_dir, "run_started", pid=me, start=who["supervisor_start"],
                 host=who["host"], **facts)  # fmt: skip
