"""A spec's text and the map from its key paths to lines: what loading needs before YAML
(standard library only, so that a cached spec is read without importing yaml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.plain import field, record
from trebuchet.runtime.rundir.regular import NotRegular, open_regular

Path_ = tuple[str | int, ...]

MAX_SPEC_BYTES = 1 << 20  # a spec is a few KB; also bounds every string in it
MAX_DEPTH = 50  # levels of nested mappings and lists
MAX_VALUES = 100_000  # values in the document, aliases expanded


@record
class Located:
    """Plain data from a YAML document plus a map from each key path to its 1-based line."""

    data: Any
    lines: dict[Path_, int] = field(default_factory=dict)
    source: str = "<spec>"
    origins: dict[Path_, str] = field(default_factory=dict)

    def at(self, path: Path_) -> str | None:
        """`file:line` of exactly `path` (or the `-o` that set it); None when the document
        does not hold it."""
        p = tuple(path)
        if p in self.origins:
            return self.origins[p]
        return f"{self.source}:{self.lines[p]}" if p in self.lines else None

    def where(self, path: Path_) -> str:
        """`file:line` of `path`, or the `-o key=value` that set it."""
        p = tuple(path)
        while p:
            found = self.at(p)
            if found is not None:
                return found
            p = p[:-1]
        return f"{self.source}:{self.lines.get((), 1)}"


def read_spec(path: Path) -> str:
    """The text of a spec file: a regular file of at most MAX_SPEC_BYTES, UTF-8."""
    try:  # regular files only, opened without a wait (runtime/rundir/regular.py)
        with open_regular(path) as fh:
            data = fh.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such spec file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: cannot read spec: it is a directory") from None
    except NotRegular:
        if os.path.isdir(path):
            raise UserError(f"{path}: cannot read spec: it is a directory") from None
        raise UserError(
            f"{path}: cannot read spec: not a regular file (a FIFO or device)"
        ) from None
    except OSError as exc:  # a symlink loop, a name too long, permissions
        raise UserError(f"{path}: cannot read spec: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise UserError(f"{path}: the spec is larger than {MAX_SPEC_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: the spec is not UTF-8 text") from None


def shortened(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters, `...` marking the cut (a value quoted in an error)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"
