"""The spec as it will run (a run's spec.yaml): expanded, defaults filled, secrets as names
only, paths absolute. Made once per spec as a template whose workdir is a placeholder, so
that a spec from the spec cache gets its spec.yaml without importing yaml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trebuchet.spec.load import LoadedSpec

PLACEHOLDER = "treb-workdir-placeholder-f3a9c1"
_LINE = f"\nworkdir: {PLACEHOLDER}\n"
_PLAIN = re.compile(r"/[A-Za-z0-9_./+-]*")  # written by yaml as it is, unquoted


def template(loaded: LoadedSpec) -> str | None:
    """spec.yaml with the workdir left to fill in; None when the placeholder is not one line
    of its own (text() then dumps the whole spec)."""
    text = _dump(loaded, PLACEHOLDER)
    return text if text.count(PLACEHOLDER) == 1 and _LINE in text else None


def text(loaded: LoadedSpec) -> str:
    """The resolved spec of `loaded`, with its workdir (the run's code snapshot)."""
    tmpl = loaded.resolved if loaded.resolved is not None else template(loaded)
    if tmpl is None:
        return _dump(loaded, str(loaded.workdir))
    return tmpl.replace(_LINE, "\n" + _workdir_line(str(loaded.workdir)), 1)


def _workdir_line(workdir: str) -> str:
    if _PLAIN.fullmatch(workdir):
        return f"workdir: {workdir}\n"
    import yaml

    return yaml.safe_dump({"workdir": workdir}, sort_keys=False, default_flow_style=False)


def data(loaded: LoadedSpec, workdir: str | None = None) -> dict[str, Any]:
    """The resolved spec as data (also the run's spec.json, for readers that do not import
    yaml: the results)."""
    from trebuchet.spec.load import input_files

    out = loaded.spec.model_dump(mode="json")
    out["workdir"] = str(loaded.workdir) if workdir is None else workdir
    for keys, value in input_files(loaded.spec):  # absolute: `treb rerun` loads it from here
        node = out
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = str(Path(loaded.base) / value)
    return out


def _dump(loaded: LoadedSpec, workdir: str) -> str:
    import yaml

    head = f"# resolved from {loaded.source}\n"
    body = yaml.safe_dump(data(loaded, workdir), sort_keys=False, default_flow_style=False)
    return head + body
