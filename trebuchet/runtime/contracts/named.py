"""typing.NamedTuple without typing, for the modules on a node agent's path to its ranks'
start (node/health.py, job/link.py): `import typing` is ~2 ms of every agent's start
(issue 36), and what its NamedTuple makes at run time is a plain collections.namedtuple.
The type checker sees typing's (`if TYPE_CHECKING: from typing import NamedTuple`).

Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

from collections import namedtuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class _NamedTupleType(type):
    """`class X(NamedTuple)` makes a collections.namedtuple of X's annotated fields (their
    defaults, its docstring, its methods), as typing's does."""

    def __new__(cls, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> Any:
        if not bases:  # NamedTuple itself
            return super().__new__(cls, name, bases, ns)
        fields = list(ns.get("__annotations__", {}))
        defaults = [ns[f] for f in fields if f in ns]
        made = namedtuple(name, fields, defaults=defaults, module=ns["__module__"])  # type: ignore[misc]  # noqa: PYI024
        made.__doc__ = ns.get("__doc__") or made.__doc__
        for key, value in ns.items():  # its methods and properties
            if not key.startswith("__") and key not in fields:
                setattr(made, key, value)
        return made


class NamedTuple(metaclass=_NamedTupleType):
    """The base of a record's class at run time (see the module's docstring)."""
