"""A validated spec read back from the spec cache (cache.py), without pydantic.

It offers the models' attributes (fields, facts, `model_dump()`, `model_fields_set`) built
only from what the models produced, so a cached spec and a validated one say the same
(tests/fast/test_spec_cache.py compares them).
"""

from __future__ import annotations

from typing import Any

from trebuchet.plain import asdict
from trebuchet.spec.facts import FACTS
from trebuchet.spec.source import Located

# A model's place in the dumped data ("" the spec, "environment", "log_policies.0") ->
# (its class name, the fields the spec set).
Models = dict[str, tuple[str, list[str]]]


def key(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


class Frozen:
    """One model's fields, read-only by convention as the models are."""

    __slots__ = ("_data", "_models", "_path")

    def __init__(self, data: dict[str, Any], models: Models, path: tuple[Any, ...] = ()) -> None:
        self._data = data
        self._models = models
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None
        return view(value, self._models, (*self._path, name))

    @property
    def model_fields_set(self) -> set[str]:
        return set(self._models[key(self._path)][1])

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """As pydantic's: a copy (the cache holds only JSON-native values, the same in
        either mode; plain.asdict copies them without importing copy)."""
        return asdict(self._data)

    def __repr__(self) -> str:
        return f"{self._models[key(self._path)][0]}(cached, {self._data!r})"


_classes: dict[str, type[Frozen]] = {}


def _frozen_class(model: str) -> type[Frozen]:
    """Frozen plus the facts of that model (SpecFacts for Spec), one class per model name."""
    if model not in _classes:
        facts = FACTS.get(model)
        bases = (Frozen, facts) if facts else (Frozen,)
        _classes[model] = type(f"Frozen{model}", bases, {"__slots__": ()})
    return _classes[model]


def view(value: Any, models: Models, path: tuple[Any, ...] = ()) -> Any:
    """`value` as the models would hold it: a model's dict as its Frozen view, a list of
    models as a list of views, anything else as it is."""
    k = key(path)
    if isinstance(value, dict) and k in models:
        return _frozen_class(models[k][0])(value, models, path)
    if isinstance(value, list) and value and f"{k}.0" in models:
        return [view(v, models, (*path, i)) for i, v in enumerate(value)]
    return value


def from_entry(entry: dict[str, Any]) -> tuple[Any, Located]:
    """(the spec's view, its Located) from a spec cache entry (cache.py)."""
    models = {k: (v[0], v[1]) for k, v in entry["models"].items()}
    located = Located(
        None,
        {tuple(k): v for k, v in entry["lines"]},
        entry["source"],
        {tuple(k): v for k, v in entry["origins"]},
    )
    return view(entry["data"], models), located
