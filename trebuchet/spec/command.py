"""A command that runs nothing: `command: ${cmd}` with cmd unset.

The node's bash expands `command`, so one made only of unset references exits 0: a run
SUCCEEDED in 0.0 s that ran nothing. Validation refuses it when every variable it names is
unset where trebuchet can tell (the spec's other shell lines may export it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from trebuchet.runtime.contracts.rank_env import NODE_NAMES, RANK_NAMES

# What bash's expansion of a command is made of, as far as trebuchet can tell: $NAME and
# the positional $@ $* $1..$9 (none in a rank's bash -c); ${NAME}, and ${NAME<op>word}
# with op one of - = + (colon or not) and a word without braces (so the innermost first:
# `${X:-${Y:-}}` is read inside out).
PLAIN = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[@*1-9])")
BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[@*1-9])(?:(:?[-=+])([^${}]*))?\}")
RUNS = "\x00"  # what a reference that expands to something (or may) becomes
# Builtins that, given no words, run nothing and exit 0 (`exec $CMD`); eval also takes
# the words quoted (`eval "$CMD"`).
NO_WORDS = re.compile(r"^\s*(?:(?:exec|eval|command|builtin)\s+)+")
SHELLS = ("bash", "sh", "dash", "zsh", "ksh")
# What a rank's environment has that the spec and the submitting shell may not show.
IN_RANK = frozenset(
    (*RANK_NAMES, *NODE_NAMES, "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "HOME",
     "PATH", "PWD", "USER", "LOGNAME", "HOSTNAME", "SHELL", "RANDOM", "SECONDS", "PPID", "UID")
)  # fmt: skip
IN_RANK_PREFIXES = ("TREB_", "SLURM_", "SKYPILOT_", "OMPI_", "PMI", "BASH", "CUDA_", "ROCR_")


def _shell_line(command: str | list[str]) -> str | None:
    """The text bash expands: the command itself, or the -c string of a list that runs a
    shell (`[bash, -c, "$CMD"]`); None for a list that runs a program as it is."""
    if isinstance(command, str):
        return command
    if len(command) >= 3 and command[0].rsplit("/", 1)[-1] in SHELLS:
        flag = command[1]
        if flag.startswith("-") and flag[1:].isalpha() and flag.endswith("c"):
            return command[2]
    return None


def empty_expansion(
    command: str | list[str],
    env: Mapping[str, Any] | None,
    environ: Mapping[str, str],
    other_shell: Iterable[str] = (),
) -> str | None:
    """Why `command` would run nothing in bash (None: it runs something, or cannot tell)."""
    text = _shell_line(command)
    if text is None:
        return None  # a program run as it is: `${cmd}` is then a program that is not found
    shell = " ".join(other_shell)
    names: list[str] = []

    positional = isinstance(command, list) and len(command) > 4  # [bash, -c, s, $0, $1..]

    def value(name: str) -> str | None:
        """The name's value: "" when set but blank, None when unset, RUNS when it may
        hold something (trebuchet or a setup line sets it, or it is not blank)."""
        if name not in names:
            names.append(name)
        if name in "@*" or name.isdigit():
            return RUNS if positional else None
        if name in IN_RANK or name.startswith(IN_RANK_PREFIXES) or re.search(rf"\b{name}\b", shell):
            return RUNS
        got = env[name] if env and name in env else environ.get(name)
        return None if got is None else RUNS if str(got).strip() else ""

    def braced(m: re.Match[str]) -> str:
        got, op, word = value(m[1]), m[2], m[3]
        given = got == RUNS if op and op.startswith(":") else got is not None
        word = RUNS if word and word.strip() else ""
        if op is None:
            return got or ""
        if op.endswith("+"):  # the word when set (":+": and not empty), else nothing
            return word if given else ""
        return (got or "") if given else word  # - and =: the value when set, else the word

    text = PLAIN.sub(lambda m: value(m[1]) or "", text)
    while True:
        text, n = BRACED.subn(braced, text)
        if not n:
            break
    if not names or RUNS in text or "$" in text:
        return None  # no reference, one that runs something, or one trebuchet cannot read
    rest = NO_WORDS.sub("", text)
    if rest != text and text.lstrip().startswith("eval"):
        rest = rest.replace('"', "").replace("'", "")
    if rest.strip():
        return None
    return _why(command, names)


def _why(command: str | list[str], names: list[str]) -> str:
    shown = ", ".join(names)
    what = repr(command.strip()) if isinstance(command, str) else repr(command)
    return (
        f"{what} expands to nothing: {shown} {'is' if len(names) == 1 else 'are'} "
        "unset or empty in the submitting environment and in env:, so bash on the node would "
        "run nothing and the run would succeed (trebuchet never expands command); set "
        f"{'it' if len(names) == 1 else 'them'}, give {'it' if len(names) == 1 else 'them'} "
        "in env:, or write the command itself"
    )
