"""`${VAR}` and `${VAR:-default}` expansion from the submitting environment.

`command` is never expanded (the node's shell does that at run time) and secret names stay
as `${NAME}` references, resolved only in memory when ranks start, so no value reaches disk.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{([^}]*)\}?")


class ExpandError(Exception):
    """A `${...}` that cannot be expanded; carries the message tail."""


def expand_text(
    text: str, environ: Mapping[str, str], secrets: frozenset[str] = frozenset(), defer: bool = True
) -> str:
    """Expand one string; secret names stay `${NAME}` when `defer`, else are an error."""

    def sub(m: re.Match[str]) -> str:
        whole = m.group(0)
        if whole == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name is None:
            raise ExpandError(f"{whole!r} is not a valid ${{VAR}} or ${{VAR:-default}} reference")
        if name in secrets:
            if defer:
                return whole
            raise ExpandError(
                f"${{{name}}} is a secret; secrets may be referenced in env values only"
            )
        if default is not None:  # as in the shell: ${VAR:-x} also replaces an empty VAR
            return environ.get(name) or default
        if name in environ:
            return environ[name]
        raise ExpandError(
            f"${{{name}}} is not set in the submitting environment and has no default "
            f"(set it, or write ${{{name}:-value}})"
        )

    return VAR.sub(sub, text)


def expand_tree(
    data: Any,
    environ: Mapping[str, str],
    secrets: frozenset[str],
    skip: Collection[tuple] = frozenset(),
    path: tuple = (),
) -> tuple[Any, list[tuple[tuple, str]]]:
    """Expand every string below `data` but the values at the `skip` paths (shell commands:
    their $VARS are the node shell's business); the new data and (path, error) pairs."""
    errors: list[tuple[tuple, str]] = []
    if path in skip:
        return data, errors
    if isinstance(data, (dict, list)):
        out: dict[Any, Any] = {}
        for k, v in data.items() if isinstance(data, dict) else enumerate(data):
            out[k], errs = expand_tree(v, environ, secrets, skip, (*path, k))
            errors += errs
        return (out if isinstance(data, dict) else list(out.values())), errors
    if isinstance(data, str) and "${" in data:
        # Secrets may be referenced from env values only, where they resolve at launch,
        # and as a webhook's URL, resolved when it is sent (runtime/publish/webhooks.py).
        defer = path[:1] == ("env",) or (path[:1] == ("notify",) and path[-1:] == ("url",))
        try:
            return expand_text(data, environ, secrets, defer=defer), errors
        except ExpandError as exc:
            return data, [(path, str(exc))]
    return data, errors
