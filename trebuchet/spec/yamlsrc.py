"""YAML loading that remembers the line of every value, so errors can point at it.

Bounded, because a spec is input from anyone: regular files only, up to MAX_SPEC_BYTES;
nesting up to MAX_DEPTH and MAX_VALUES counted after alias expansion ("billion laughs");
an alias inside its own anchor is refused. Each refusal names the line.
"""

from __future__ import annotations

from typing import Any

import yaml

from trebuchet.errors import SpecError
from trebuchet.spec.source import (  # noqa: F401 - also the names importers use
    MAX_DEPTH,
    MAX_SPEC_BYTES,
    MAX_VALUES,
    Located,
    Path_,
    dotted,
    read_spec,
)


class _Problem(Exception):
    """A refusal at a line of the document (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer stops at MAX_DEPTH (it recurses once per level)."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _Problem(mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Builder:
    """Nodes -> plain data and lines, counting values and refusing alias cycles."""

    def __init__(self, ctor: yaml.SafeLoader, lines: dict[Path_, int]) -> None:
        self.ctor = ctor
        self.lines = lines
        self.count = 0
        self.open: set[int] = set()  # the collections being built (an alias back is a cycle)

    def build(self, node: yaml.Node, path: Path_) -> Any:
        line = node.start_mark.line + 1
        self.lines.setdefault(path, line)
        self.count += 1
        if self.count > MAX_VALUES:
            raise _Problem(line, f"more than {MAX_VALUES} values (aliases expanded)")
        if len(path) > MAX_DEPTH:
            raise _Problem(line, f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return self.scalar(node, line)
        if id(node) in self.open:
            raise _Problem(line, f"{dotted(path)}: an alias refers to its own anchor (a cycle)")
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(v, (*path, i)) for i, v in enumerate(node.value)]
            return self.mapping(node, path, line)
        finally:
            self.open.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: Path_, line: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            key = self.scalar(key_node, key_line) if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, (str, int, float, bool)):
                raise _Problem(key_line, "keys must be plain names")
            if isinstance(key, bool):  # YAML 1.1 reads `on:`/`yes:` as true: a key is a name
                key = str(key_node.value)
            key = key if isinstance(key, str) else str(key)
            if key in out:
                raise _Problem(key_line, f"{key}: duplicate key")
            at = (*path, key)  # a name: mypy's parser refuses d[(*a, b)] before Python 3.11
            self.lines[at] = key_line
            out[key] = self.build(value_node, at)
        return out

    def scalar(self, node: yaml.Node, line: int) -> Any:
        try:
            return self.ctor.construct_object(node, deep=True)
        except (ValueError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
            raise _Problem(line, f"cannot read the value: {exc}") from None


def _parse(text: str) -> tuple[Any, dict[Path_, int]]:
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, {(): 1}
        lines: dict[Path_, int] = {}
        return _Builder(loader, lines).build(root, ()), lines
    finally:
        loader.dispose()


def _why(exc: yaml.YAMLError) -> tuple[int | None, str]:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        return (mark.line + 1 if mark else 1), f"invalid YAML: {exc.problem or exc.context}"
    return None, f"invalid YAML: {exc}"


def parse_yaml(text: str, source: str) -> Located:
    """Parse one YAML document; syntax errors and limits become SpecError with file:line."""
    try:
        data, lines = _parse(text)
    except _Problem as exc:
        raise SpecError([f"{source}:{exc.line}: {exc.message}"]) from None
    except yaml.YAMLError as exc:
        line, why = _why(exc)
        raise SpecError([f"{source}:{line}: {why}" if line else f"{source}: {why}"]) from None
    return Located(data, lines, source)


def yaml_value(text: str) -> Any:
    """One value written in YAML (an `-o` value), within the same limits; ValueError why."""
    try:
        return _parse(text)[0]
    except _Problem as exc:
        raise ValueError(exc.message) from None
    except yaml.YAMLError as exc:
        raise ValueError(_why(exc)[1]) from None
