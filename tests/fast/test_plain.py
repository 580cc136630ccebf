"""trebuchet/plain.py: each record class behaves as @dataclass would make it (the launch path
uses it instead of dataclasses, whose import costs ~20 ms of every `treb run`)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest

import trebuchet
from trebuchet import plain


def twins(frozen: bool = False) -> tuple[type, type]:
    """The same class, made by @dataclass and by @record."""
    made = []
    for deco in (dataclasses.dataclass(frozen=frozen), plain.record(frozen=frozen)):
        field = dataclasses.field if deco.__module__ == "dataclasses" else plain.field

        class Probe:
            """A probe."""

            name: str
            size: int = 3
            tags: list[str] = field(default_factory=list)
            meta: dict[str, int] = field(default_factory=dict)
            note: str | None = None

        made.append(deco(Probe))
    return made[0], made[1]


@pytest.mark.parametrize("frozen", [False, True])
def test_a_record_is_what_a_dataclass_is(frozen: bool) -> None:
    dc, rec = twins(frozen)
    calls = [(("a",), {}), (("a", 4), {"note": "n"}), ((), {"name": "b", "tags": ["x"]}),
             (("a", 1, ["t"], {"k": 1}, "z"), {})]  # fmt: skip
    for args, kwargs in calls:
        d, r = dc(*args, **kwargs), rec(*args, **kwargs)
        assert dataclasses.asdict(d) == plain.asdict(r)
        assert repr(d).replace(dc.__qualname__, "P") == repr(r).replace(rec.__qualname__, "P")
        assert r == rec(*args, **kwargs) and r != rec("other") and r != d
    assert [f.name for f in dataclasses.fields(dc)] == [f.name for f in plain.fields(rec)]
    assert [f.name for f in plain.fields(rec("a"))] == [f.name for f in plain.fields(rec)]
    first, second = rec("a"), rec("a")
    assert first.tags is not second.tags and first.meta is not second.meta  # fresh defaults
    assert rec.__match_args__ == dc.__match_args__
    for bad_args, bad_kwargs in [((), {}), (("a",), {"name": "b"}), (("a",), {"nope": 1}),
                                 (("a", 1, [], {}, None, "extra"), {})]:  # fmt: skip
        with pytest.raises(TypeError):
            dc(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError):
            rec(*bad_args, **bad_kwargs)
    r, d = rec("a"), dc("a")
    if frozen:
        for made in (r, d):  # a list field makes either unhashable
            with pytest.raises(TypeError, match="unhashable"):
                hash(made)

        @plain.record(frozen=True)
        class Point:
            x: int
            y: int = 0

        assert hash(Point(1)) == hash(Point(1, 0)) and {Point(1), Point(1, 0)} == {Point(1)}
        with pytest.raises(AttributeError):
            r.name = "b"
        with pytest.raises(dataclasses.FrozenInstanceError):
            d.name = "b"
        with pytest.raises(plain.FrozenInstanceError):
            del r.size
    else:
        with pytest.raises(TypeError):
            hash(r)
        with pytest.raises(TypeError):
            hash(d)
        r.name = "b"
        assert r.name == "b"


def test_nested_records_and_copies() -> None:
    @plain.record
    class Inner:
        values: list[int] = plain.field(default_factory=list)

    @plain.record
    class Outer:
        inner: Inner
        more: list[Inner] = plain.field(default_factory=list)

    inner = Inner([1, 2])
    data = plain.asdict(Outer(inner, [Inner([3])]))
    assert data == {"inner": {"values": [1, 2]}, "more": [{"values": [3]}]}
    data["inner"]["values"].append(9)
    assert inner.values == [1, 2]  # a copy, as dataclasses.asdict makes


def test_a_required_field_after_a_default_is_refused() -> None:
    class Bad:
        a: int = 1
        b: int

    with pytest.raises(TypeError, match="b has no default"):
        plain.record(Bad)


def test_every_record_of_the_package_has_its_fields() -> None:
    """Every @record class in trebuchet: its fields are its annotations (no ClassVar), in
    order, and it takes them as keywords."""
    found = 0
    for info in pkgutil.walk_packages(trebuchet.__path__, "trebuchet."):
        if info.name.startswith("trebuchet.ui") or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and obj.__module__ == info.name
                and hasattr(obj, "__record_fields__")
            ):
                notes = [n for n, t in obj.__annotations__.items() if "ClassVar" not in str(t)]
                assert [f.name for f in plain.fields(obj)] == notes, obj
                found += 1
    assert found >= 18  # the local plan and its processes are TypedDicts now (contracts)
