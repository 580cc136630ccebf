"""A command that runs nothing: `command: ${cmd}` with cmd unset.

Trebuchet never expands `command` (the node's bash does, when the rank starts), so a
command made only of variable references that are all unset or empty there becomes an
empty bash command, which exits 0 at once: a run SUCCEEDED in 0.0 s that ran nothing.
Validation (validate.py) refuses such a command, with its file:line, when every variable
it names is unset where trebuchet can tell: the spec's `env`, the submitting environment
(which `${VAR}` elsewhere in the spec expands from, and which local ranks inherit), and
neither set by trebuchet in the rank (RANK, SLURM_*, ...) nor named by the spec's other
shell lines (`slurm.setup` may export it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from trebuchet.runtime.contract import NODE_NAMES, RANK_NAMES

# $NAME, ${NAME}, and ${NAME:-word} / ${NAME-word} / ${NAME:=word} with a literal word
# (no $, braces): bash's parameter expansions whose value trebuchet can tell. An empty or
# blank word expands to nothing as an unset NAME does (`${X:-}`); any other word runs.
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-=]([^${}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
# What a rank's environment has that the spec and the submitting shell may not show.
IN_RANK = frozenset(
    (*RANK_NAMES, *NODE_NAMES, "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "HOME",
     "PATH", "PWD", "USER", "LOGNAME", "HOSTNAME", "SHELL", "RANDOM", "SECONDS", "PPID", "UID")
)  # fmt: skip
IN_RANK_PREFIXES = ("TREB_", "SLURM_", "SKYPILOT_", "OMPI_", "PMI", "BASH", "CUDA_", "ROCR_")


def empty_expansion(
    command: str | list[str],
    env: Mapping[str, Any] | None,
    environ: Mapping[str, str],
    other_shell: Iterable[str] = (),
) -> str | None:
    """Why `command` would run nothing in bash (None: it runs something, or cannot tell)."""
    if not isinstance(command, str):
        return None  # a list runs as is: `${cmd}` is then a program name that is not found
    refs = REF.findall(command)
    if not refs or REF.sub("", command).strip():
        return None
    if any(word.strip() for _, word, _ in refs):  # a default that runs something
        return None
    names = list(dict.fromkeys(a or b for a, _, b in refs))
    shell = " ".join(other_shell)
    for name in names:
        if name in IN_RANK or name.startswith(IN_RANK_PREFIXES) or re.search(rf"\b{name}\b", shell):
            return None
        value = env[name] if env and name in env else environ.get(name)
        if value is not None and str(value).strip():
            return None
    shown = ", ".join(names)
    return (
        f"{command.strip()!r} expands to nothing: {shown} {'is' if len(names) == 1 else 'are'} "
        "unset or empty in the submitting environment and in env:, so bash on the node would "
        "run nothing and the run would succeed (trebuchet never expands command); set "
        f"{'it' if len(names) == 1 else 'them'}, give {'it' if len(names) == 1 else 'them'} "
        "in env:, or write the command itself"
    )
