"""Sweeps: `-o env.LR=1e-3,3e-4 -o env.BS=32,64` (or a `sweep:` block) launch the cross
product as separate runs grouped under one sweep id.

Locally a driver starts at most `sweep_parallel` runs at once (default 1): in the `treb
run` process when attached, else in the background (`python -m trebuchet.launcher.sweep
SWEEP_FILE`). It imports no pydantic: every run's plan was written at submission.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.errors import UserError

if TYPE_CHECKING:
    from trebuchet.backends.base import SubmissionPoint, SweepSubmitted
    from trebuchet.backends.local import LocalBackend

MAX_SWEEP_POINTS = 10_000  # runs in one sweep (docs/spec.md; spec/model.py checks `sweep:`)
# A comma separates sweep values unless escaped (\,) or inside [...], {...} or quotes.
_SPLIT = re.compile(r"(?<!\\),")


def point_text(point: dict[str, Any]) -> str:
    """A sweep point as the user wrote it: `env.LR=0.1 env.BS=32` (not a Python dict);
    a value with spaces or a list/mapping is shown as JSON."""
    shown = []
    for key, value in point.items():
        plain = isinstance(value, str) and value and not any(c.isspace() for c in value)
        text = value if plain else json.dumps(value)
        shown.append(f"{key}={text}")
    return " ".join(shown)


def split_values(value: str) -> list[str]:
    v = value.strip()
    if not v or v[0] in "[{'\"":
        return [value]
    return [part.replace("\\,", ",") for part in _SPLIT.split(value)]


def points(
    overrides: list[str], block: dict[str, list[Any]] | None
) -> tuple[list[str], list[dict[str, str]]]:
    """(fixed overrides, one dict of swept overrides per run); one empty dict: no sweep."""
    fixed: list[str] = []
    axes: list[tuple[str, list[str]]] = []
    for text in overrides:
        key, sep, value = text.partition("=")
        values = split_values(value) if sep else [value]
        if sep and len(values) > 1:
            axes.append((key.strip(), values))
        else:
            fixed.append(text.replace("\\,", ","))
    for key, values in (block or {}).items():
        if key not in {k for k, _ in axes}:
            axes.append((key, [_text(v) for v in values]))
    if not axes:
        return fixed, [{}]
    count = 1
    for _, values in axes:
        count *= len(values)
    if count > MAX_SWEEP_POINTS:  # counted before a point is built: millions would take GBs
        sizes = " x ".join(f"{k} ({len(v)})" for k, v in axes)
        raise UserError(f"sweep: {sizes} is {count} points, more than {MAX_SWEEP_POINTS}")
    keys = [k for k, _ in axes]
    return fixed, [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))
    ]


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def new_sweep_id() -> str:
    return "s" + os.urandom(4).hex()[:7]  # the secrets module's source, without its imports


def sweep_file(sweep_id: str) -> Path:
    from trebuchet.store.paths import treb_home

    path = treb_home() / "sweeps"
    path.mkdir(exist_ok=True, mode=0o700)
    return path / f"{sweep_id}.json"


def submit_local(
    engine: LocalBackend, sweep_id: str, points: list[SubmissionPoint], attach: bool
) -> SweepSubmitted:
    """The local engine's sweep: every run's plan written now, then the driver, in this
    process (attached) or in the background."""
    import subprocess

    from trebuchet.backends.base import SweepSubmitted
    from trebuchet.store.files import write_json

    parallel = points[0][1].loaded.spec.sweep_parallel or 1
    runs: list[dict[str, Any]] = []
    for index, (point, sub) in enumerate(points):
        plan = engine.write_plan(sub)
        runs.append({"index": index, "id": sub.record.id, "run_dir": str(sub.run_dir),
                     "params": point, "streams": plan.streams})  # fmt: skip
    path = sweep_file(sweep_id)
    write_json(path, {"id": sweep_id, "parallel": parallel, "runs": runs})
    print(f"treb: sweep {sweep_id}: {len(runs)} runs, at most {parallel} at once", file=sys.stderr)
    for run in runs:
        print(f"treb:   {run['index']}  {run['id']}  {point_text(run['params'])}", file=sys.stderr)
    if not attach:
        subprocess.Popen(
            [sys.executable, "-m", "trebuchet.launcher.sweep", str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        return SweepSubmitted(sweep_id, len(runs))
    failed, sig = drive(json.loads(path.read_text()), follow=True)
    return SweepSubmitted(sweep_id, len(runs), failed, sig or None)


def drive(sweep: dict[str, Any], follow: bool) -> tuple[int, int]:
    """Start the sweep's runs, at most `parallel` at once; returns (runs that did not
    succeed, the signal that cancelled the sweep or 0)."""
    from trebuchet.backends.local import start_supervisor
    from trebuchet.store.db import Store
    from trebuchet.store.states import CANCELLED, TERMINAL

    store = Store()
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
                store.update_run(
                    run["id"], only_if_active=True, state=CANCELLED, ended_at=time.time()
                )
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


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def main(argv: list[str]) -> int:
    sweep = json.loads(Path(argv[0]).read_text())
    failed, sig = drive(sweep, follow=False)
    return 128 + sig if sig else int(failed > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
