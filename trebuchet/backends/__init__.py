"""Engines by name: `--on NAME` gets its engine here (get_backend), from the registry
(trebuchet/registry.py, re-exported: `trebuchet.backends.register` is the plugin API);
refresh asks each engine about its active runs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from trebuchet import registry
from trebuchet.backends.base import Backend, Submitted, SweepSubmitted
from trebuchet.errors import UserError
from trebuchet.registry import (
    ENTRY_POINT_GROUP,
    Registration,
    generation,
    load_entry_points,
    names,
    option_models,
    register,
)

if TYPE_CHECKING:
    from trebuchet.store.db import RunRecord, Store

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "Registration",
    "Submitted",
    "SweepSubmitted",
    "generation",
    "get_backend",
    "load_entry_points",
    "names",
    "option_models",
    "register",
]


def get_backend(name: str) -> Backend:
    """The engine called `name`, imported only when asked for (keeps the CLI fast)."""
    if name not in registry.registry:
        load_entry_points()
    reg = registry.registry.get(name)
    if reg is None:
        raise UserError(f"--on {name}: unknown engine (known: {', '.join(names())})")
    if name not in registry.engines:
        try:
            obj = registry.resolve(reg.engine)
        except (ImportError, AttributeError) as exc:
            why = f"the engine {reg.engine!r} cannot be loaded: {exc}"
            raise UserError(f"--on {name}: {why}") from None
        if isinstance(obj, type) and issubclass(obj, Backend):
            try:
                obj = obj()
            except TypeError as exc:  # abstract methods left unimplemented
                raise UserError(f"--on {name}: {reg.engine!r} is incomplete: {exc}") from None
        if not isinstance(obj, Backend):
            raise UserError(f"--on {name}: {reg.engine!r} is not a trebuchet engine (base.Backend)")
        registry.engines[name] = obj
    return registry.engines[name]


def sweep_engines() -> list[str]:
    """The engines that run sweeps (imports every engine: for error messages only)."""
    found = []
    for name in names():
        try:
            if get_backend(name).sweeps:
                found.append(name)
        except (ImportError, UserError):
            continue
    return found


def refresh(store: Store, runs: list[RunRecord]) -> None:
    """Let each engine update its active runs, in one batch per engine (runs of an engine
    that is not installed here are left as they are); then ingest their new metrics."""
    by_engine: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in runs:
        if rec.active:
            by_engine[rec.backend].append(rec)
    for name, recs in by_engine.items():
        try:
            engine = get_backend(name)
        except UserError:
            continue
        engine.refresh(store, recs)
    if by_engine:  # what their agents wrote since the last look (store/metrics.py)
        from trebuchet.store.metrics import ingest

        for recs in by_engine.values():
            for rec in recs:
                ingest(store, rec)
