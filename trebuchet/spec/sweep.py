"""Sweeps as users write them: `--sweep -o env.LR=1e-3,3e-4 -o env.BS=32,64` or a `sweep:`
block make the cross product, one run a point. Without --sweep (Hydra's --multirun) a comma
in an -o value is part of the value.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from typing import Any

from trebuchet.errors import UserError

MAX_SWEEP_POINTS = 10_000  # runs in one sweep (docs/spec.md; spec/model.py checks `sweep:`)
# A comma separates sweep values unless escaped (\,) or inside [...], {...} or quotes.
_SPLIT = re.compile(r"(?<!\\),")


def point_text(point: dict[str, Any]) -> str:
    """A sweep point as the user wrote it: `env.LR=0.1 env.BS=32` (not a Python dict)."""
    shown = []
    for key, value in point.items():
        plain = isinstance(value, str) and value and not any(c.isspace() for c in value)
        text = value if plain else json.dumps(value)
        shown.append(f"{key}={text}")
    return " ".join(shown)


def split_values(value: str) -> list[str]:
    v = value.strip()
    if not v or v[0] in "[{'\"":
        return [value]
    return [part.replace("\\,", ",") for part in _SPLIT.split(value)]


def literal(overrides: list[str]) -> list[str]:
    """Overrides without --sweep: a comma is part of the value; `\\,` still reads as a comma
    (the escape a sweep needs means the same without one)."""
    return [text.replace("\\,", ",") for text in overrides]


def points(
    overrides: list[str], block: dict[str, list[Any]] | None
) -> tuple[list[str], list[dict[str, str]]]:
    """(fixed overrides, one dict of swept overrides per run); one empty dict: no sweep."""
    fixed: list[str] = []
    axes: list[tuple[str, list[str]]] = []
    for text in overrides:
        key, sep, value = text.partition("=")
        values = split_values(value) if sep else [value]
        if sep and len(values) > 1:
            axes.append((key.strip(), values))
        else:
            fixed.append(text.replace("\\,", ","))
    for key, values in (block or {}).items():
        if key not in {k for k, _ in axes}:
            axes.append((key, [_text(v) for v in values]))
    if not axes:
        return fixed, [{}]
    count = math.prod(len(values) for _, values in axes)
    if count > MAX_SWEEP_POINTS:  # counted before a point is built: millions would take GBs
        sizes = " x ".join(f"{k} ({len(v)})" for k, v in axes)
        raise UserError(f"sweep: {sizes} is {count} points, more than {MAX_SWEEP_POINTS}")
    keys = [k for k, _ in axes]
    return fixed, [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))
    ]


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def new_sweep_id() -> str:
    return "s" + os.urandom(4).hex()[:7]  # the secrets module's source, without its imports
