"""The job controller's records (runtime/lifecycle.Records) for the engines supervised on
this machine (local, ssh): the run index (store/db.py) and the run's events.jsonl, written
together, and the attached terminal's lines. One place for what a run's life writes, so
that a rebuilt index (store/rebuild.py, from the events) says what the live one said."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trebuchet.runtime.contracts.schema import FirstFailure, Hang
from trebuchet.store import lifecycle
from trebuchet.store.db import Store
from trebuchet.store.files import append_event
from trebuchet.store.states import RUNNING

Say = Callable[[str], None]


class IndexRecords:
    def __init__(self, store: Store, run_id: str, run_dir: Path, say: Say,
                 hang_lines: Callable[[Path], list[str]] | None = None) -> None:  # fmt: skip
        self.store, self.run_id, self.run_dir = store, run_id, run_dir
        self._say = say
        self.hang_lines = hang_lines  # the hang in words (diagnose/, handed down)

    def say(self, text: str) -> None:
        self._say(text)

    def event(self, kind: str, **fields: Any) -> None:
        append_event(self.run_dir, kind, **fields)

    def attempt_started(self, attempt: int, started_at: float, **facts: Any) -> None:
        (self.run_dir / f"attempt-{attempt}").mkdir(mode=0o700, exist_ok=True)
        self.store.set_attempt(self.run_id, attempt, state=RUNNING, started_at=started_at)
        self.state("attempt_started", attempt=attempt, **facts)

    def attempt_stopped(self, attempt: int, state: str, reason: str) -> None:
        """An attempt that ended before its ranks started (a failed `pre`)."""
        self.store.set_attempt(self.run_id, attempt, state=state, ended_at=time.time(),
                               reason=reason)  # fmt: skip

    def attempt_ended(self, attempt: int, state: str, reason: str | None) -> None:
        self.store.set_attempt(self.run_id, attempt, state=state, ended_at=time.time(),
                               reason=reason)  # fmt: skip
        self.event("attempt_ended", attempt=attempt, state=state)

    def first_failure(self, cause: FirstFailure) -> None:
        self.store.update_run(self.run_id, first_failure=cause)

    def hang(self, attempt: int, info: Hang, action: str) -> None:
        adir = self.run_dir / f"attempt-{attempt}"
        if self.hang_lines is not None:
            lines = self.hang_lines(adir)
        else:
            from trebuchet.runtime.watch.hung import describe

            lines = [describe(info)]
        for line in lines:
            self.say(line)
        if action != "warn":
            self.store.set_attempt(self.run_id, attempt, reason="hang")

    def log_policy(self, attempt: int, name: str, action: str, line: str) -> None:
        self.event("log_policy", attempt=attempt, policy=name, action=action, line=line)
        self.say(f"log policy {name} ({action}) matched: {line}")
        self.store.set_attempt(self.run_id, attempt, reason=f"{name}: {action}")

    def max_attempts(self, count: int, granted: dict[str, int]) -> None:
        self.store.update_run(self.run_id, max_attempts=count)

    def retrying(self, attempt: int) -> None:
        self.state("retrying", attempt=attempt)

    def run_ended(
        self, state: str, cause: FirstFailure | None, exit_code: int, reason: str | None = None
    ) -> None:
        index = {"exit_code": exit_code, "first_failure": cause}
        self.state("run_ended", index, state=state, **({"reason": reason} if reason else {}))

    def state(self, kind: str, index: dict[str, Any] | None = None, **fields: Any) -> None:
        """An event that moves the run's state: the index follows it (store/lifecycle.py)."""
        lifecycle.record(self.store, self.run_id, kind, index, False, **fields)

    def heartbeat(self) -> None:
        self.store.update_run(self.run_id, last_seen=time.time())
