"""Runs a local job file (job.json) to its end: attempts, first-failure teardown, cancel,
timeout, records.

It is the attached `treb run` itself, or a small background process for detached runs
(`python -m trebuchet.cli.supervise RUN_DIR`). It imports neither torch nor pydantic.
Every rank runs in the run's cgroup v2 where one can be created (runtime/process/contain.py), in
its own process group, and dies with the supervisor (the watchdog kills its group); at the
end of each attempt everything left in the cgroup, every process still carrying the run's
TREB_RUN_ID and every orphan the supervisor adopted as a subreaper is killed, so a run
never leaves orphans.

This module is the supervisor's process: its entry (main), the run's watchdog and cgroup
(begin), its end (leave). It imports little: the Supervisor itself (local_nodes.py), with
the ~100 modules it needs, is imported once the cgroup move has begun, so that those
imports pass during the move's wait (an RCU grace period) instead of before it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

from trebuchet.launcher.hooks import Hooks
from trebuchet.launcher.submitted import Submitted
from trebuchet.launcher.watchdog import Watchdog
from trebuchet.runtime.process import contain
from trebuchet.runtime.rundir import records
from trebuchet.runtime.rundir.records import sync
from trebuchet.store import lifecycle
from trebuchet.store.db import Store
from trebuchet.store.files import read_json
from trebuchet.store.states import FAILED, SUCCEEDED

if TYPE_CHECKING:
    from trebuchet.runtime.contracts.schema import JobFile


def disk_full(exc: BaseException, run_dir: Path) -> str | None:
    """'no space left on device (<path>)' when `exc` is a full disk or quota, else None."""
    import errno
    import sqlite3

    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device ({exc.filename or run_dir})"
    if isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc):
        return f"no space left on device ({run_dir.parent.parent / 'runs.db'})"
    return None


def record_abort(store: Store, run_id: str, attempt: int, why: str | None) -> None:
    """The supervisor's own failure in the index: FAILED with the full disk as the first
    failure, LOST for anything else; when even that cannot be written, the message above
    (terminal or supervisor.log) is what remains."""
    now = time.time()
    try:
        if why is None:
            lifecycle.ended(store, run_id, "LOST", "the supervisor failed", "lost", when=now)
            return
        cause = records.cause("disk", 1, attempt, message=why)
        lifecycle.ended(store, run_id, FAILED, why, attempt=attempt, when=now, exit_code=1,
                        first_failure=cause)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the disk may refuse this too
        print(f"treb: run {run_id}: could not record the outcome: {exc}", file=sys.stderr)


Begun = tuple[Watchdog, "str | None", str]  # the watchdog, the cgroup (None: none) and how


def begin(job: JobFile) -> Begun:
    """The run's watchdog, then its cgroup, with this process's move into it begun unless
    an environment is built first (the build moves in itself: local_nodes.prepare). Called
    before the Supervisor is made, so that the move's wait (an RCU grace period, 10-25 ms
    here) passes during its setup instead of before the first start; nothing may fork or
    start a thread until then (either waits for the move). If the process ends before the
    Supervisor runs, the watchdog ends the run (and finds the cgroup by its name)."""
    watchdog = Watchdog(job["run_id"], job["run_dir"])  # before the cgroup move (a fork waits)
    cgroup, how = contain.create(contain.cgroup_name(job["run_id"]))
    if cgroup is not None:
        watchdog.cgroup(cgroup)
    if not job["plan"]["environment"]:
        contain.enter_early(cgroup)  # nothing forks until the first start
    return watchdog, cgroup, how


def main(
    argv: list[str],
    job: JobFile | None = None,
    unsynced: list[str] | None = None,
    hooks: Hooks | None = None,
) -> int:
    """A run's own supervisor process (its entry: cli/supervise.py): in the background for
    a detached run, or `--attached` in the `treb run` process that handed itself over
    (backends/local.py), which passes the job file it wrote and the run's files it left
    unsynced."""
    run_dir = Path(argv[-1])
    job = job or cast("JobFile", read_json(run_dir / "job.json"))
    store = Store()
    try:
        if (run_dir / "after.json").exists():  # --after: wait first (launcher/waiting.py)
            from trebuchet.launcher import waiting

            if not waiting.wait(store, job["run_id"], run_dir, (hooks or Hooks()).refresh):
                return 0  # a dependency cannot end as asked (recorded), or cancelled
        return _supervise(argv, job, store, run_dir, unsynced or [], hooks or Hooks())
    finally:
        store.close()  # the last connection checkpoints the index: the outcome is durable


def leave(code: int) -> NoReturn:
    """End the supervisor's process once its run is recorded and reported (its index
    connections closed): stdout and stderr flushed, the interpreter's teardown skipped.
    Freeing ~200 modules took ~40 ms here, after the summary, before the shell's prompt."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _supervise(argv: list[str], job: JobFile, store: Store, run_dir: Path, unsynced: list[str],
               hooks: Hooks) -> int:  # fmt: skip
    attached = "--attached" in argv
    profile = "none"
    if "--profile" in argv:
        profile = argv[argv.index("--profile") + 1]
    view = None
    if attached:
        from trebuchet.view.live import View

        view = View()  # its thread before the cgroup move begins (a new thread waits too)
    begun = begin(job)
    from trebuchet.launcher.local_nodes import Supervisor  # its imports: during the move

    sync(unsynced)  # the run's files: durable while the cgroup move waits (~10 ms of fsyncs)
    sup = Supervisor(job, store, view, own_process=True, begun=begun, hooks=hooks)
    sup.install_signals()
    if attached:  # signals blocked across the exec: handled from here on
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        state = sup.run()
    except BaseException as exc:
        why = disk_full(exc, run_dir)
        if why is None:
            import traceback

            traceback.print_exc()
        else:  # not a bug: say what is full, and record it as the cause when there is room
            print(f"treb: run {job['run_id']} stopped: {why}", file=sys.stderr, flush=True)
        record_abort(store, job["run_id"], sup.attempt, why)
        return 1
    finally:
        if view:
            view.close()
    if not attached or hooks.end is None:
        sup.reap()
        return 0 if state == SUCCEEDED else 1
    rec = store.get(job["run_id"])
    result = Submitted(job["run_id"], state, rec.exit_code if rec else None, sup.cancel_signal)
    code = hooks.end(store, result, run_dir, profile)
    sup.reap()
    return code
