"""The Python API: `launch()` a spec, get a `Run` whose `wait()` raises when the run fails."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trebuchet.errors import RunFailed, UserError
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.states import SUCCEEDED, TERMINAL, describe_failure

log = logging.getLogger("trebuchet")


class Run:
    """A handle on a run in the store; every property reads its current record.

    `warnings`: what launch() found worth saying (preflight warnings, files left out of
    the code snapshot), each as `treb run` prints it; empty for a Run made from an id."""

    def __init__(
        self, run_id: str, store: Store | None = None, warnings: Sequence[str] = ()
    ) -> None:
        self.id = run_id
        self._store = store or Store()
        self.warnings = list(warnings)

    def __repr__(self) -> str:
        return f"Run({self.id!r}, state={self.state!r})"

    @property
    def record(self) -> RunRecord:
        from trebuchet.runner import refresh

        rec = self._store.get(self.id)
        if rec is None:
            raise UserError(f"no run {self.id}")
        if rec.active:
            refresh(self._store, [rec])
            rec = self._store.get(self.id) or rec
        return rec

    @property
    def state(self) -> str:
        return self.record.state

    @property
    def run_dir(self) -> Path:
        return Path(self.record.run_dir)

    def wait(self, timeout: float | None = None, poll: float = 0.2) -> Run:
        """Block until the run ends; raise RunFailed unless it SUCCEEDED."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rec = self.record
            if rec.state in TERMINAL:
                if rec.state != SUCCEEDED:
                    raise self._failed(rec)
                return self
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.id} still {rec.state} after {timeout} s")
            time.sleep(poll)

    def _failed(self, rec: RunRecord) -> RunFailed:
        """RunFailed with the first failure and the diagnosis' error line (its summary)."""
        ff = rec.first_failure or {}
        detail = describe_failure(ff) if ff else ""
        try:
            from trebuchet.diagnose.report import diagnose_record

            d = diagnose_record(self._store, rec)
        except Exception:  # noqa: BLE001 - the failure is raised whatever the logs hold
            d = None
        found = d if d is not None and d.category is not None else None
        return RunFailed(
            rec.id, rec.state, detail, error=found.summary if found is not None else None,
            rank=ff.get("rank", found.rank if found is not None else None),
            exit_code=ff.get("exit_code", rec.exit_code),
            cause=found.category if found is not None else None,
            log=ff.get("log") or (found.log if found is not None else None),
        )  # fmt: skip

    def cancel(self) -> None:
        from trebuchet.backends import get_backend

        rec = self.record
        if rec.active:
            get_backend(rec.backend).cancel(self._store, rec)

    def logs(self, rank: int = 0, attempt: int | None = None) -> str:
        """The text of one rank's log (under torchrun/none: the node's log if no rank log)."""
        rec = self.record
        adir = Path(rec.run_dir) / f"attempt-{rec.attempt if attempt is None else attempt}"
        for name in (f"rank-{rank}.log", f"node-{rank}.log"):
            if (adir / name).exists():
                try:  # a regular file only: the rank can put a FIFO in its place
                    return read_text(adir / name)
                except OSError:
                    return ""
        return ""


def launch(
    spec_or_path: str | Path | dict[str, Any],
    on: str = "local",
    overrides: Sequence[str] = (),
    name: str | None = None,
    check: bool = True,
    resume_from: str | None = None,
) -> Run:
    """Validate and start one run in the background (runner.py, as `treb run --detach`);
    returns at once with its Run.

    With `check`, the preflight checks of `treb check` run first: their errors raise
    SpecError. `resume_from`: a run id whose checkpoints the new run starts with.
    Warnings are on `Run.warnings`, and logged to the `trebuchet` logger."""
    from trebuchet import runner

    extra = [f"name={name}"] if name else []
    started = runner.launch(
        spec_or_path, on, [*overrides, *extra], preflight=check, sweeps=False,
        warn=lambda text: log.warning("%s", text), resume_from=resume_from,
    )  # fmt: skip
    return Run(started.subs[0].record.id, started.subs[0].store, started.warnings)
