"""The one path from a spec to a started run (load -> preflight -> engine check -> record
-> submit -> follow), for `treb run`, `treb render` and `trebuchet.launch()`: they must
refuse, record and start a run the same way. Nothing here prints (warnings go to `warn`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.errors import UserError
from trebuchet.plain import field, record

if TYPE_CHECKING:
    from trebuchet.backends.base import Backend, SpecPoint, Submitted, SweepSubmitted
    from trebuchet.launcher.hooks import Hooks
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store

Source = str | Path | dict[str, Any]  # a spec file, or its fields as a dict
Warn = Callable[[str], None]


@record
class Checked:
    """A spec that passed every check for its engine; nothing is recorded yet."""

    on: str
    engine: Backend
    points: list[SpecPoint]  # a single run: one point, ({}, spec)
    sweep: bool
    warnings: list[str] = field(default_factory=list)
    warn: Warn | None = None
    resume: tuple[str, Path] | None = None  # --resume-from: (run id, its checkpoints)

    def add_warning(self, text: str) -> None:
        self.warnings.append(text)
        if self.warn:
            self.warn(text)


@record
class Started:
    """The recorded runs (one, or a sweep's points in order) and what the engine said."""

    subs: list[Submission]
    result: Submitted | SweepSubmitted
    warnings: list[str]


def _load(source: Source, overrides: Sequence[str], cached: bool = True) -> LoadedSpec:
    from trebuchet.spec.load import load_spec

    if isinstance(source, dict):
        return load_spec(data=source, overrides=overrides, cached=cached)
    return load_spec(source, overrides, cached=cached)


def _expand(
    source: Source, on: str, overrides: Sequence[str], sweeps: bool = True, multirun: bool = False
) -> tuple[LoadedSpec, Backend, list[SpecPoint] | None]:
    """(the spec, its engine, every sweep point's spec or None when it is one run). A comma
    in an override sweeps only with `multirun` (--sweep): `-o env.NCCL_IB_HCA=mlx5_0,mlx5_1`
    is never a silent two-run sweep. sweeps=False (launch()) refuses a `sweep:` block."""
    from trebuchet.backends import get_backend
    from trebuchet.spec import sweep

    overrides = list(overrides)
    multirun = multirun and sweeps
    fixed, axes = sweep.points(overrides, None) if multirun else (sweep.literal(overrides), [{}])
    base = _load(source, fixed)
    if base.spec.sweep and not sweeps:
        raise UserError(
            f"{base.where('sweep')}: sweep: launch() starts one run; use `treb run` for sweeps"
        )
    engine = get_backend(on)
    if not base.spec.sweep and axes == [{}]:
        return base, engine, None
    if not engine.sweeps:
        from trebuchet.backends import sweep_engines

        able = sweep_engines()
        listed = " and ".join([", ".join(able[:-1]), able[-1]] if len(able) > 1 else able)
        raise UserError(f"--on {on}: sweeps run on the {listed} backends only so far")
    # Every point validated before anything is recorded: a bad value fails the whole sweep.
    points = []
    for point in sweep.points(overrides if multirun else [], base.spec.sweep)[1]:
        point_overrides = [*fixed, *(f"{k}={v}" for k, v in point.items()), "sweep=null"]
        points.append((point, _load(source, point_overrides, cached=False)))
    engine.check_sweep(points)
    return base, engine, points


def check(
    source: Source,
    on: str = "local",
    overrides: Sequence[str] = (),
    *,
    preflight: bool = True,
    sweeps: bool = True,
    multirun: bool = False,
    warn: Warn | None = None,
    resume_from: str | None = None,
    after: Sequence[str] = (),
) -> Checked:
    """Load the spec, run the preflight checks and the engine's own: every refusal raises
    here (exit 2), before anything is recorded."""
    base, engine, points = _expand(source, on, overrides, sweeps, multirun)
    checked = Checked(on, engine, points or [({}, base)], points is not None, warn=warn)
    if after:
        _depend(checked, after)
    if resume_from is not None:
        from trebuchet.launcher import resume
        from trebuchet.store.db import Store

        checked.resume = resume.source(Store(), resume_from, engine)
    if preflight:
        from trebuchet.preflight import enforce

        for finding in enforce(base, engine):
            checked.add_warning(finding.text())
    for _, loaded in checked.points:
        engine.check(loaded)
    return checked


def start(
    checked: Checked,
    attach: bool = False,
    announce: Callable[[Submission], None] | None = None,
    handover: Hooks | None = None,
) -> Started:
    """Record the runs, then hand them to the engine; attached, follow until they end.
    `handover` (`treb run` only): an attached single run may take over this process
    (Backend.handover), its supervisor given these hooks."""
    from trebuchet import tracking
    from trebuchet.launcher.submit import prepare
    from trebuchet.store.db import Store

    store = Store()
    engine = checked.engine
    if not checked.sweep:
        # Handed over, the run's files are synced by whoever runs it (the local supervisor
        # does it while its cgroup move waits); not taken over, they are synced below.
        waits = checked.points[0][1].after
        attach = attach and not waits  # a run that waits is detached: it outlives this one
        takeover = attach and handover is not None
        sub = prepare(checked.points[0][1], checked.on, store, checked.resume, not takeover)
        try:
            if waits:
                checked.add_warning(_record_after(sub, waits))
            for text in sub.warnings:
                checked.add_warning(f"warning: {text}")
            tracking.open_run(sub, checked.add_warning)
            if announce:
                announce(sub)
        except BaseException:  # Ctrl+C before any supervisor has it: no run PENDING forever;
            from trebuchet.store import lifecycle  # recorded (a tracker may hold it): CANCELLED

            with contextlib.suppress(Exception):
                lifecycle.ended(store, sub.record.id, "CANCELLED", "cancelled before it started")
            raise
        if takeover:
            engine.handover(sub, handover)
            sub.sync()
        result = engine.submit(sub, attach)
        if attach:
            tracking.close_ended(store, [sub.record])
        return Started([sub], result, checked.warnings)
    from trebuchet.spec.sweep import new_sweep_id

    sweep_id = new_sweep_id()
    parent = tracking.open_sweep(sweep_id, checked.points[0][1], len(checked.points),
                                 checked.add_warning)  # fmt: skip
    points = []
    for point, loaded in checked.points:
        sub = prepare(loaded, checked.on, store, checked.resume)
        store.update_run(sub.record.id, sweep_id=sweep_id, params=json.dumps(point, sort_keys=True))
        tracking.open_run(sub, checked.add_warning, params=point, sweep_id=sweep_id, parent=parent)
        points.append((point, sub))
    for text in points[0][1].warnings:  # one workdir: the points' snapshots say the same
        checked.add_warning(f"warning: {text}")
    swept = engine.submit_sweep(sweep_id, points, attach)
    if attach:
        tracking.close_ended(store, [sub.record for _, sub in points])
    return Started([sub for _, sub in points], swept, checked.warnings)


def launch(
    source: Source,
    on: str = "local",
    overrides: Sequence[str] = (),
    *,
    attach: bool = False,
    preflight: bool = True,
    sweeps: bool = True,
    multirun: bool = False,
    warn: Warn | None = None,
    announce: Callable[[Submission], None] | None = None,
    handover: Hooks | None = None,
    resume_from: str | None = None,
    after: Sequence[str] = (),
) -> Started:
    """check() then start(): `treb run` and trebuchet.launch()."""
    checked = check(source, on, overrides, preflight=preflight, sweeps=sweeps,
                    multirun=multirun, warn=warn, resume_from=resume_from,
                    after=after)  # fmt: skip
    return start(checked, attach, announce, handover)


def refresh(store: Store, runs: list[RunRecord]) -> None:
    """Each engine's word on the active `runs`, then the trackers' end of those that ended
    meanwhile (tracking.py)."""
    import os

    from trebuchet.backends import refresh as refresh_engines
    from trebuchet.store.paths import home_path

    active = [r for r in runs if r.active]
    refresh_engines(store, active)
    tracked = [r for r in active if os.path.exists(os.path.join(r.run_dir, "tracking.json"))]
    # TREB_HOME/tracking-pending: runs whose tracker did not take everything yet (retried)
    if tracked or os.path.isdir(os.path.join(home_path(), "tracking-pending")):
        from trebuchet.tracking import close_ended

        close_ended(store, tracked)


def render(
    source: Source,
    on: str = "local",
    overrides: Sequence[str] = (),
    multirun: bool = False,
    after: Sequence[str] = (),
) -> str:
    """`treb render`: what would be submitted, without the preflight checks or those of the
    tools needed only to run."""
    base, engine, points = _expand(source, on, overrides, multirun=multirun)
    if after:
        _depend(Checked(on, engine, points or [({}, base)], points is not None), after)
    return engine.render(base) if points is None else engine.render_sweep(points)


def _depend(checked: Checked, refs: Sequence[str]) -> None:
    """--after's runs, resolved now (an unknown one: exit 2) onto LoadedSpec.after, where
    the engine's check may refuse them."""
    from trebuchet.store import after
    from trebuchet.store.db import Store

    if checked.sweep:
        raise UserError("--after applies to one run, not to a sweep")
    checked.points[0][1].after = after.parse(Store(), list(refs))


def _record_after(sub: Submission, deps: list[dict[str, Any]]) -> str:
    """What the PENDING run waits for, into after.json, the index and an event; in words."""
    from trebuchet.store import after
    from trebuchet.store.files import append_event

    after.write(sub.run_dir, deps)
    sub.store.update_run(sub.record.id, waiting=after.waiting(deps))
    append_event(sub.run_dir, "after", runs=deps)
    return f"run {sub.record.id} waits for {after.phrase(deps)}"


def exit_code(result: Submitted | SweepSubmitted) -> int:
    """`treb run`'s exit status: 0, 1 (failed, timeout, lost; a sweep: any point did not
    succeed), 130 / 128 + the signal that cancelled it."""
    from trebuchet.backends.base import SweepSubmitted
    from trebuchet.store.states import CANCELLED, EXIT_CODES

    if isinstance(result, SweepSubmitted):
        if result.cancel_signal:
            return 128 + result.cancel_signal
        return 1 if result.failed else 0
    if result.state is None:  # handed over (detached)
        return 0
    if result.state == CANCELLED and result.cancel_signal:
        return 128 + result.cancel_signal
    return EXIT_CODES.get(result.state, 1)
