"""Data classes for what `treb run` imports, without the dataclasses module.

`import dataclasses` pulls in inspect, ast, dis and tokenize (~20 ms of every `treb run`)
and each @dataclass compiles code. `record` gives a class the same `__init__` (defaults,
`field(default_factory=...)`), `__eq__`, `__hash__` and `__repr__` from its annotated fields
without generating code; `frozen=True` refuses assignments; `asdict` and `fields` answer as
dataclasses' do. Nothing more (tests/fast/test_plain.py holds each class to @dataclass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

T = TypeVar("T")

if TYPE_CHECKING:  # in typing from 3.11; the type checker alone reads this import
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kwargs: Any) -> Callable[[T], T]:
        return lambda decorated: decorated


class FrozenInstanceError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field:
    """A field's name and how its default is made (what `fields()` lists)."""

    __slots__ = ("name", "default", "default_factory")

    def __init__(self, name: str, default: Any, default_factory: Callable[[], Any] | None):
        self.name = name
        self.default = default
        self.default_factory = default_factory


_NONE = object()  # no default: the argument is required


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A default made afresh for each instance (a list, a dict)."""
    return cast(T, _Factory(default_factory))  # what @record reads (as dataclasses.field)


def fields(obj: Any) -> tuple[Field, ...]:
    owner: Any = type(obj) if not isinstance(obj, type) else obj  # set by _install
    return owner.__record_fields__


def asdict(obj: Any) -> Any:
    """Records, lists, tuples and dicts as plain data, the rest deep-copied (as
    dataclasses.asdict)."""
    if hasattr(type(obj), "__record_fields__") and not isinstance(obj, type):
        return {f.name: asdict(getattr(obj, f.name)) for f in obj.__record_fields__}
    if isinstance(obj, (list, tuple)):
        return type(obj)(asdict(v) for v in obj)
    if isinstance(obj, dict):
        return {asdict(k): asdict(v) for k, v in obj.items()}
    if obj is None or isinstance(obj, (str, int, float, bytes)):
        return obj  # immutable: what deepcopy returns (and no import of copy at launch)
    import copy

    return copy.deepcopy(obj)


@overload
def record(cls: type[T], *, frozen: bool = False) -> type[T]: ...
@overload
def record(cls: None = None, *, frozen: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(field,))
def record(
    cls: type[T] | None = None, *, frozen: bool = False
) -> type[T] | Callable[[type[T]], type[T]]:
    """@record or @record(frozen=True) in place of @dataclass / @dataclass(frozen=True)."""

    def make(cls: type[T]) -> type[T]:
        specs = []
        for name, note in cls.__dict__.get("__annotations__", {}).items():
            if "ClassVar" in str(note):
                continue
            value = cls.__dict__.get(name, _NONE)
            if isinstance(value, _Factory):
                delattr(cls, name)
                specs.append(Field(name, _NONE, value.make))
            else:
                specs.append(Field(name, value, None))
        defaulted = False
        for f in specs:
            if f.default is not _NONE or f.default_factory is not None:
                defaulted = True
            elif defaulted:
                raise TypeError(f"{cls.__name__}: field {f.name} has no default, but one before "
                                "it has")  # fmt: skip
        _install(cls, tuple(specs), frozen)
        return cls

    return make if cls is None else make(cls)


def _install(cls: Any, specs: tuple[Field, ...], frozen: bool) -> None:
    # cls: Any, as no type checker follows the methods it is given here.
    names = tuple(f.name for f in specs)
    setter = object.__setattr__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(specs):
            raise TypeError(
                f"{cls.__name__}.__init__() takes {len(specs) + 1} positional arguments "
                f"but {len(args) + 1} were given"
            )
        for f, value in zip(specs, args, strict=False):  # fewer args: the rest below
            if f.name in kwargs:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument "
                                f"'{f.name}'")  # fmt: skip
            setter(self, f.name, value)
        for f in specs[len(args) :]:
            if f.name in kwargs:
                setter(self, f.name, kwargs.pop(f.name))
            elif f.default_factory is not None:
                setter(self, f.name, f.default_factory())
            elif f.default is not _NONE:
                setter(self, f.name, f.default)
            else:
                raise TypeError(f"{cls.__name__}.__init__() missing 1 required positional "
                                f"argument: '{f.name}'")  # fmt: skip
        if kwargs:
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")  # fmt: skip

    def values(self: Any) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in names)

    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return values(self) == values(other)

    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{cls.__qualname__}({inner})"

    cls.__record_fields__ = specs
    cls.__init__ = __init__
    cls.__eq__ = __eq__
    cls.__repr__ = __repr__
    cls.__match_args__ = names  # type: ignore[misc]  # mypy refuses it even on Any
    if frozen:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field '{name}'")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field '{name}'")

        cls.__setattr__ = __setattr__
        cls.__delattr__ = __delattr__
        cls.__hash__ = lambda self: hash(values(self))
    else:
        cls.__hash__ = None  # as @dataclass: eq without frozen
