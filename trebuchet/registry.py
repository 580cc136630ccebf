"""Engines by name: which module holds each engine and its spec block, imported on first use.

Below every other part (it imports none): the spec model asks it for the engines' blocks,
backends/ for the engines (get_backend). Built-in engines are listed below; others come
from the `trebuchet.engines` entry point group (`myengine = "pkg:MyEngine"`), registered as
`register(name, value)`. An engine's spec block is its `options` model or the
`module:attribute` given here, so the built-in engine modules stay free of pydantic and
listing the names never imports an engine.
"""

from __future__ import annotations

import importlib
from typing import Any

from trebuchet.plain import record

ENTRY_POINT_GROUP = "trebuchet.engines"
DEFAULT = "local"  # the engine of a run that names none (`--on`'s default)


@record(frozen=True)
class Registration:
    name: str
    engine: Any  # "module:attribute", a Backend instance, or a Backend subclass
    # "module:attribute" of its spec block's model, or the model; False: no block; None:
    # the engine's own `options` (importing the engine when a spec is loaded).
    options: Any = None
    # whether its runs' node names are machines a later run may get again (store/nodes.py
    # remembers them); False: simulated nodes, as the local engine's node-0, node-1
    real_nodes: bool = True


def _builtin(name: str, options: str | bool, real_nodes: bool = True) -> Registration:
    """A built-in engine: backends/<name>/engine.py's BACKEND, its block options.py's model."""
    home = f"trebuchet.backends.{name}"
    model = f"{home}.options:{options}" if isinstance(options, str) else options
    return Registration(name, f"{home}.engine:BACKEND", model, real_nodes)


BUILTIN = (
    _builtin("local", False, real_nodes=False),  # simulated nodes, here
    _builtin("slurm", "Slurm"),  # an sbatch script; submits, follows, cancels
    _builtin("skypilot", "SkyPilot"),  # a task YAML handed to SkyPilot
    _builtin("ssh", "Ssh"),  # one node agent per host over ssh, supervised here
    _builtin("kubernetes", "Kubernetes"),  # an indexed Job and a headless Service
)

registry: dict[str, Registration] = {r.name: r for r in BUILTIN}
engines: dict[str, Any] = {}  # the engine objects made so far (backends.get_backend)
_entry_points_read = False
_generation = 0  # changes whenever an engine is registered: the spec model is rebuilt


def register(name: str, engine: Any, options: Any = None) -> None:
    """Add (or replace) the engine called `name`. `engine` is a Backend instance or class,
    or the `module:attribute` of one, imported when first asked for; `options` as in
    Registration (None: the engine's own `options` attribute)."""
    global _generation
    if not name or not name.replace("-", "").replace("_", "").isalnum() or name != name.lower():
        raise ValueError(f"engine name {name!r}: use lower-case letters, digits, - and _")
    registry[name] = Registration(name, engine, options)
    engines.pop(name, None)
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
        if ep.name not in registry:
            register(ep.name, ep.value)


def generation() -> int:
    return _generation


def names() -> list[str]:
    """Every engine's name, without importing any engine module."""
    load_entry_points()
    return list(registry)


def resolve(target: Any) -> Any:
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        obj: Any = importlib.import_module(module)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj
    return target


def option_models() -> list[tuple[str, Any]]:
    """(engine name, model of its spec block) for every engine that has a block."""
    load_entry_points()
    out = []
    for name, reg in list(registry.items()):
        if reg.options is False:
            continue
        try:
            model = (resolve(reg.options) if reg.options is not None
                     else getattr(resolve(reg.engine), "options", None))  # fmt: skip
        except (ImportError, AttributeError):
            continue  # a broken engine: refused with its reason when `--on` names it
        if model is not None:
            out.append((name, model))
    return out
