"""The local engine's sweeps: at most `sweep_parallel` runs at once, driven in the `treb
run` process when attached, else in the background. It imports no pydantic: every run's
plan was written at submission. A point waiting for its turn has no supervisor yet: the
driver says it is alive (`driver_alive`), so that a refresh takes the point for queued,
not lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.runtime.process.procs import alive, start_time
from trebuchet.spec.sweep import point_text
from trebuchet.store import lifecycle
from trebuchet.store.files import read_json, write_json
from trebuchet.store.paths import sweep_file

if TYPE_CHECKING:
    from trebuchet.backends.base import SubmissionPoint, SweepSubmitted
    from trebuchet.backends.local.engine import LocalBackend


def submit_local(
    engine: LocalBackend, sweep_id: str, points: list[SubmissionPoint], attach: bool
) -> SweepSubmitted:
    """Every run's plan written now, then the driver, here (attached) or in the background."""
    import subprocess

    from trebuchet.backends.base import SweepSubmitted

    parallel = points[0][1].loaded.spec.sweep_parallel or 1
    runs: list[dict[str, Any]] = []
    for index, (point, sub) in enumerate(points):
        job = engine.write_plan(sub)
        runs.append({"index": index, "id": sub.record.id, "run_dir": str(sub.run_dir),
                     "params": point, "streams": job["plan"]["streams"]})  # fmt: skip
    path = sweep_file(sweep_id)
    write_json(path, {"id": sweep_id, "parallel": parallel, "runs": runs})
    print(f"treb: sweep {sweep_id}: {len(runs)} runs, at most {parallel} at once", file=sys.stderr)
    for run in runs:
        print(f"treb:   {run['index']}  {run['id']}  {point_text(run['params'])}", file=sys.stderr)
    if not attach:
        subprocess.Popen(
            [sys.executable, "-m", "trebuchet.backends.local.sweep", str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        return SweepSubmitted(sweep_id, len(runs))
    failed, sig = drive(json.loads(path.read_text()), follow=True)
    return SweepSubmitted(sweep_id, len(runs), failed, sig or None)


def drive(sweep: dict[str, Any], follow: bool) -> tuple[int, int]:
    """Start the sweep's runs, at most `parallel` at once; returns (runs that did not
    succeed, the signal that cancelled the sweep or 0)."""
    from trebuchet.backends.local.engine import start_supervisor
    from trebuchet.store.db import Store
    from trebuchet.store.states import CANCELLED, TERMINAL

    store = Store()
    _say_alive(str(sweep["id"]))
    pending = list(sweep["runs"])
    running: list[dict[str, Any]] = []
    failed = 0
    cancelled = {"sig": 0}
    signal.signal(signal.SIGINT, lambda s, f: cancelled.update(sig=s))
    signal.signal(signal.SIGTERM, lambda s, f: cancelled.update(sig=s))
    view = None
    if follow:
        from trebuchet.view.live import View

        view = View()
    while pending or running:
        while pending and len(running) < sweep["parallel"] and not cancelled["sig"]:
            run = pending.pop(0)
            rec = store.get(run["id"])
            if rec is None or rec.state != "PENDING":  # cancelled before its turn
                failed += 1
                continue
            start_supervisor(store, run["id"], Path(run["run_dir"]))
            running.append(run)
            if view:
                for label, name in run["streams"]:
                    view.add(f"{run['index']}|{label}", Path(run["run_dir"]) / "attempt-0" / name)
        if cancelled["sig"]:
            for run in pending:
                lifecycle.ended(store, run["id"], CANCELLED, "the sweep was cancelled")
            pending = []
            for run in running:
                rec = store.get(run["id"])
                if rec and rec.active and rec.supervisor_pid:
                    _kill(rec.supervisor_pid)
        for run in list(running):
            rec = store.get(run["id"])
            if rec is None or rec.state in TERMINAL:
                running.remove(run)
                failed += int(rec is None or rec.state != "SUCCEEDED")
                if view:
                    state = rec.state if rec else "?"
                    params = point_text(run["params"])
                    view.say(f"sweep point {run['index']} ({run['id']}) {state}: {params}")
        time.sleep(0.1)
    if view:
        view.close()
    return failed, cancelled["sig"]


def _driver_file(sweep_id: str) -> Path:
    return sweep_file(sweep_id).with_name(f"{sweep_id}.driver.json")


def _say_alive(sweep_id: str) -> None:
    """This process drives the sweep (read by driver_alive)."""
    pid = os.getpid()
    write_json(_driver_file(sweep_id), {"pid": pid, "start": start_time(pid)}, durable=False)


def driver_alive(sweep_id: str) -> bool:
    """Whether the sweep's driver still runs (pid and start time: a reused pid is not it)."""
    try:
        data = read_json(_driver_file(sweep_id))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return False
    start = data.get("start")
    return alive(data["pid"], start if isinstance(start, str) else None)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def main(argv: list[str]) -> int:
    sweep = json.loads(Path(argv[0]).read_text())
    failed, sig = drive(sweep, follow=False)
    return 128 + sig if sig else int(failed > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
