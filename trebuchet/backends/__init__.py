"""Engines by name: the registry behind `--on NAME`.

An engine is registered under a name with the `module:attribute` of its object (an
instance of base.Backend, or the class), imported on first use so that `treb ps` and
`treb --help` load only the engines they touch. The built-in engines are listed below;
others come from installed packages through the `trebuchet.engines` entry point group,
where each entry point is registered as `register(entry_point.name, entry_point.value)`:

    [project.entry-points."trebuchet.engines"]
    myengine = "trebuchet_myengine:MyEngine"

An engine's block of options in the spec (`slurm:`, ...) is its `options` model, or the
`module:attribute` given at registration (the built-ins: their engine modules stay free
of pydantic). Listing the names never imports an engine module; building the spec model
imports the option models, and the modules of registered engines that name none.
"""

from __future__ import annotations

import importlib
import os
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import Backend, Submitted, SweepSubmitted
from trebuchet.errors import UserError
from trebuchet.plain import record

if TYPE_CHECKING:
    from trebuchet.store.db import RunRecord, Store

__all__ = ["Backend", "Submitted", "SweepSubmitted", "get_backend", "names", "register"]

ENTRY_POINT_GROUP = "trebuchet.engines"


@record(frozen=True)
class Registration:
    name: str
    engine: Any  # "module:attribute", a Backend instance, or a Backend subclass
    # "module:attribute" of its spec block's model, or the model; False: no block; None:
    # the engine's own `options` (importing the engine when a spec is loaded).
    options: Any = None


BUILTIN = (
    Registration("local", "trebuchet.backends.local:BACKEND", False),  # simulated nodes, here
    Registration(  # an sbatch script; submits, follows, cancels
        "slurm", "trebuchet.backends.slurm:BACKEND", "trebuchet.backends.slurm_options:Slurm"
    ),
    Registration(  # a task YAML handed to SkyPilot
        "skypilot",
        "trebuchet.backends.skypilot:BACKEND",
        "trebuchet.backends.skypilot_options:SkyPilot",
    ),
    Registration(  # one node agent per host over ssh, supervised here
        "ssh", "trebuchet.backends.ssh:BACKEND", "trebuchet.backends.ssh_options:Ssh"
    ),
    Registration(  # an indexed Job and a headless Service
        "kubernetes",
        "trebuchet.backends.kubernetes:BACKEND",
        "trebuchet.backends.kubernetes_options:Kubernetes",
    ),
)

_registry: dict[str, Registration] = {r.name: r for r in BUILTIN}
_engines: dict[str, Backend] = {}
_entry_points_read = False
_generation = 0  # changes whenever an engine is registered: the spec model is rebuilt


def register(name: str, engine: Any, options: Any = None) -> None:
    """Add (or replace) the engine called `name`. `engine` is a Backend instance or class,
    or the `module:attribute` of one, imported when first asked for; `options` as in
    Registration (None: the engine's own `options` attribute)."""
    global _generation
    if not name or not name.replace("-", "").replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"engine name {name!r}: use lower-case letters, digits, - and _")
    _registry[name] = Registration(name, engine, options)
    _engines.pop(name, None)
    _generation += 1


def load_entry_points() -> None:
    """Register every engine installed packages declare (once per process); a name that is
    already registered keeps its registration."""
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _registry:
            register(ep.name, ep.value)


def generation() -> int:
    return _generation


def names() -> list[str]:
    """Every engine's name, without importing any engine module."""
    load_entry_points()
    return list(_registry)


def _resolve(target: Any) -> Any:
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj
    return target


def get_backend(name: str) -> Backend:
    """The engine called `name`, imported only when asked for (keeps the CLI fast)."""
    if name not in _registry:
        load_entry_points()
    reg = _registry.get(name)
    if reg is None:
        raise UserError(f"--on {name}: unknown engine (known: {', '.join(names())})")
    if name not in _engines:
        try:
            obj = _resolve(reg.engine)
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
        _engines[name] = obj
    return _engines[name]


def option_models() -> list[tuple[str, Any]]:
    """(engine name, model of its spec block) for every engine that has a block."""
    load_entry_points()
    out = []
    for name, reg in list(_registry.items()):
        if reg.options is False:
            continue
        try:
            model = _resolve(reg.options) if reg.options is not None else get_backend(name).options
        except (ImportError, AttributeError, UserError):
            continue  # a broken engine: refused with its reason when `--on` names it
        if model is not None:
            out.append((name, model))
    return out


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
    tracked = [r for recs in by_engine.values() for r in recs
               if os.path.exists(os.path.join(r.run_dir, "tracking.json"))]  # fmt: skip
    if tracked:  # runs that ended elsewhere (or were found LOST): their trackers' end
        from trebuchet.launcher.tracking import close_ended

        close_ended(store, tracked)
