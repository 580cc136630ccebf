"""YAML loading that remembers the line of every value, so errors can point at it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from trebuchet.errors import SpecError

Path_ = tuple[str | int, ...]


@dataclass
class Located:
    """Plain data from a YAML document plus a map from each key path to its 1-based line."""

    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    source: str = "<spec>"
    origins: dict[Path_, str] = field(default_factory=dict)

    def where(self, path: Path_) -> str:
        """`file:line` of `path`, or the `-o key=value` that set it."""
        p = tuple(path)
        while p:
            if p in self.origins:
                return self.origins[p]
            if p in self.lines:
                return f"{self.source}:{self.lines[p]}"
            p = p[:-1]
        return f"{self.source}:{self.lines.get((), 1)}"


def _build(node: yaml.Node, path: Path_, lines: dict[Path_, int], ctor: yaml.SafeLoader) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = ctor.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise SpecError([f"{lines.get(path, 1)}: keys must be plain names"])
            key = str(key) if not isinstance(key, str) else key
            if key in out:
                raise SpecError([f"{key_node.start_mark.line + 1}: {key}: duplicate key"])
            lines[(*path, key)] = key_node.start_mark.line + 1
            out[key] = _build(value_node, (*path, key), lines, ctor)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(v, (*path, i), lines, ctor) for i, v in enumerate(node.value)]
    return ctor.construct_object(node, deep=True)


def parse_yaml(text: str, source: str) -> Located:
    """Parse one YAML document; syntax errors become SpecError with file:line."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                return Located(None, {(): 1}, source)
            lines: dict[Path_, int] = {}
            data = _build(root, (), lines, loader)
        finally:
            loader.dispose()
    except SpecError as exc:
        raise SpecError([f"{source}:{p}" for p in exc.problems]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        why = exc.problem or exc.context or "invalid YAML"
        raise SpecError([f"{source}:{line}: invalid YAML: {why}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"{source}: invalid YAML: {exc}"]) from None
    return Located(data, lines, source)
