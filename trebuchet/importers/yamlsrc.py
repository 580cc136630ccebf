"""Reading YAML/JSON inputs with the line of every key, for importers' notes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trebuchet.errors import SpecError, UserError
from trebuchet.importers.common import read_text
from trebuchet.spec.yamlsrc import Located, parse_yaml


def read_located(path: str | Path) -> Located:
    p = Path(path)
    text = read_text(p, "a config file")
    try:
        return parse_yaml(text.replace("\t", "    "), str(p))
    except SpecError as exc:
        raise UserError("\n".join(exc.problems)) from None


def read_mapping(path: str | Path, what: str) -> tuple[Path, Located, dict]:
    """(path, located document, its mapping) of a config that must be a mapping."""
    p = Path(path)
    loc = read_located(p)
    if not isinstance(loc.data, dict):
        raise UserError(f"{p}:1: {what} must be a mapping")
    return p, loc, loc.data


def locator(loc: Located, *base: Any) -> Callable[..., int | None]:
    """`at(*keys)`: the line of the key at `base + keys` (else its nearest located parent's)."""
    return lambda *keys: line_of(loc, *base, *keys)


def line_of(loc: Located, *path: Any) -> int | None:
    p = tuple(path)
    while p:
        if p in loc.lines:
            return loc.lines[p]
        p = p[:-1]
    return None
