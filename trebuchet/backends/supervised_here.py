"""Engines whose run is supervised by a process on this machine (local, ssh): the
supervisor writes the run index itself, a run whose supervisor vanished is LOST, and a
cancel is a SIGTERM to that supervisor, which ends every node's processes and sessions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from trebuchet.backends.base import Backend
from trebuchet.errors import UserError
from trebuchet.runtime.process.contain import end_run
from trebuchet.runtime.process.procs import alive, hostname, start_time
from trebuchet.store import lifecycle
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import read_json
from trebuchet.store.states import CANCELLED, LOST, TERMINAL

# A PENDING run without a supervisor this long after its creation is lost, unless it is a
# sweep point whose driver is alive (queued for its turn); TREB_ORPHAN_PENDING_S for tests.
ORPHAN_PENDING_S = 60.0


class SupervisedHere(Backend):
    """refresh and cancel for a run whose supervisor is a process on this host."""

    def sweep_queued(self, sweep_id: str) -> bool:
        """A sweep point waiting for its turn (its sweep's driver alive): not lost."""
        return False

    def refresh(self, store: Store, runs: list[RunRecord]) -> None:
        """Active runs whose supervisor vanished without an outcome become LOST."""
        me = hostname()
        now = time.time()
        drivers: dict[str, bool] = {}  # sweep id -> its driver is alive (asked once)
        for rec in runs:
            if not rec.active or (rec.host and rec.host != me):
                continue
            if rec.supervisor_pid is None:
                if now - rec.created_at < orphan_pending_s():
                    continue
                if rec.sweep_id:
                    if rec.sweep_id not in drivers:
                        drivers[rec.sweep_id] = self.sweep_queued(rec.sweep_id)
                    if drivers[rec.sweep_id]:
                        continue
            elif alive(rec.supervisor_pid, rec.supervisor_start):
                continue
            fresh = store.get(rec.id)  # it may have finished since it was read
            if not fresh or not fresh.active:
                continue
            last = fresh.last_seen or fresh.started_at or fresh.created_at
            reason = "supervisor gone" + end_leftovers(rec)
            if lifecycle.ended(store, rec.id, LOST, reason, "lost", when=last):
                store.set_attempt(rec.id, fresh.attempt, reason=reason)
                rec.state = LOST

    def cancel(self, store: Store, run: RunRecord) -> None:
        """SIGTERM to the supervisor; waits for its record (the grace period and 15 s)."""
        if run.host and run.host != hostname():
            raise UserError(f"run {run.id} is supervised on host {run.host}; cancel it there")
        if run.supervisor_pid and alive(run.supervisor_pid, run.supervisor_start):
            os.kill(run.supervisor_pid, 15)
            job = read_json(Path(run.run_dir) / "job.json") or {}
            deadline = time.time() + float(job.get("grace", 5.0)) + 15
            while time.time() < deadline:
                rec = store.get(run.id)
                if rec is None or rec.state in TERMINAL:
                    return
                if not alive(run.supervisor_pid, run.supervisor_start):
                    break  # it died of the SIGTERM before it could record anything
                time.sleep(0.05)
            else:
                raise UserError(f"run {run.id} did not stop within the grace period")
        end_leftovers(run)  # what a supervisor that is gone left running
        lifecycle.ended(store, run.id, CANCELLED, "treb cancel")


# What an attached run supervised in the caller's process takes for its supervisor.
SUPERVISOR_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                      signal.SIGUSR2, signal.SIGCHLD)  # fmt: skip


@contextlib.contextmanager
def signals_lent() -> Iterator[None]:
    """The caller's signal handlers (and wakeup fd) back once the run supervised in its
    process has ended: the ended supervisor's handler left in place swallowed the next
    Ctrl+C (between an attached sweep's points, or in the caller's own code)."""
    handlers = {sig: signal.getsignal(sig) for sig in SUPERVISOR_SIGNALS}
    wake = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wake)
    try:
        yield
    finally:
        signal.set_wakeup_fd(wake)
        for sig, handler in handlers.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def start_detached(store: Store, run_id: str, run_dir: Path, module: str) -> int:
    """A detached run's supervisor (`python -m module RUN_DIR`): a background process in its
    own session."""
    log = os.open(run_dir / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(run_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(log)
    store.update_run(
        run_id, only_if_active=True, supervisor_pid=proc.pid,
        supervisor_start=start_time(proc.pid), host=hostname(),
    )  # fmt: skip
    return proc.pid


def orphan_pending_s() -> float:
    try:
        return float(os.environ.get("TREB_ORPHAN_PENDING_S", ORPHAN_PENDING_S))
    except ValueError:
        return ORPHAN_PENDING_S


def end_leftovers(run: RunRecord) -> str:
    """SIGKILL the processes of a run whose supervisor is gone (its watchdog too, or they
    would be gone): from the run's cgroup, else by TREB_RUN_ID."""
    found = end_run(run.id, run.run_dir, {os.getpid()})
    by = (("in its cgroup", found["cgroup"]), ("by TREB_RUN_ID", found["scan"]))
    ways = [f"{how} (pids {', '.join(map(str, pids))})" for how, pids in by if pids]
    if not ways:
        return ""
    n = len(found["cgroup"]) + len(found["scan"])
    return f" and so was its watchdog: {n} leftover process(es) ended, found {' and '.join(ways)}"
