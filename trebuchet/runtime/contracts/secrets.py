"""Secrets reach a rank by name: `${NAME}` (or `${NAME:-default}`) in an env value is
filled, when the ranks start, from the environment of the process that starts them (the
submitting shell locally, the engine's secret store on a node), never from a file."""

from __future__ import annotations

import re
from typing import Collection, Mapping

SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def resolve(value: str, names: Collection[str], environ: Mapping[str, str]) -> str:
    """`value` with the references to the secrets `names` filled in; any other `${...}`
    stays as written (it was expanded at submission already, or is meant literally)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            return m.group(0)
        default: str = m.group(2) or ""  # the group is None when not given
        return environ.get(m.group(1)) or default

    return SECRET_REF.sub(sub, value)
