"""`treb completion bash|zsh|fish`: a shell completion script for verbs, flags and run ids.

The verbs and flags are read from the parser when the script is printed (so the script
matches this version of treb); run ids come, at each Tab, from `treb ps -q --all
--no-refresh`: the index only, without asking the engines, importing no pydantic, rich
or engine module. zsh uses the bash script through bashcompinit."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

IDS = "treb ps -q --all --no-refresh 2>/dev/null"
RUN_METAVARS = {"RUN", "RUN | LOG", "RUN | SWEEP", "SPEC | RUN"}
FILE_METAVARS = {"SPEC", "FILE", "RUN | LOG", "SPEC | RUN", "SPEC | SCRIPT.py ARG... | -- COMMAND"}


@dataclass
class Verb:
    """What one verb completes: its flags, the values of some, its positional kind."""

    flags: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # flag -> "ids" | "files" | words
    positionals: list[str] = field(default_factory=list)  # per position: "ids", "files", words


def _kind(action: argparse.Action, engines: list[str], states: list[str]) -> str:
    if action.choices:
        return " ".join(action.choices)
    meta = action.metavar or ""
    if meta == "BACKEND":
        return " ".join(engines)
    if meta == "STATE":
        return " ".join(states)
    kinds = (["ids"] if meta in RUN_METAVARS else []) + (["files"] if meta in FILE_METAVARS else [])
    return " ".join(kinds)


def verbs(parser: argparse.ArgumentParser) -> dict[str, Verb]:
    from trebuchet.backends import names
    from trebuchet.cli.filters import GROUPS, STATES

    engines, states = names(), [s.lower() for s in STATES] + list(GROUPS)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, Verb] = {}
    for name, p in sub.choices.items():
        verb = Verb()
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if action.option_strings:
                verb.flags += action.option_strings
                if action.nargs != 0:
                    for flag in action.option_strings:
                        verb.values[flag] = _kind(action, engines, states)
            else:
                verb.positionals.append(_kind(action, engines, states))
        out[name] = verb
    return out


def _candidates(kind: str, ids: str) -> str:
    """The words of `kind`, `ids` (the shell's expression for the run ids) for "ids"."""
    parts = kind.split()
    words = " ".join(w for w in parts if w not in ("ids", "files"))
    return f"{words} {ids}".strip() if "ids" in parts else words


def _words(kind: str) -> str:
    return f'"{_candidates(kind, f"$({IDS})")}"'  # a bash word


def bash(vs: dict[str, Verb]) -> str:
    value_cases, flag_cases, pos_cases = [], [], []
    for name, v in vs.items():
        for flag, kind in v.values.items():
            files = "; _treb_files" if "files" in kind.split() else ""
            value_cases.append(
                f'        {name}:{flag}) COMPREPLY=($(compgen -W {_words(kind)} -- "$cur")){files}'
                "; return;;"
            )
        flag_cases.append(f'        {name}) flags="{" ".join(v.flags)}"; '
                          f'vflags=" {" ".join(v.values)} ";;')  # fmt: skip
        for i, kind in enumerate(v.positionals):  # the last one repeats (RUN...)
            files = "; _treb_files" if "files" in kind.split() else ""
            at = f"{i}" if i < len(v.positionals) - 1 else "*"
            pos_cases.append(
                f'        {name}:{at}) COMPREPLY=($(compgen -W {_words(kind)} -- "$cur")){files};;'
            )
    return BASH.format(
        verbs=" ".join(vs), values="\n".join(value_cases), flags="\n".join(flag_cases),
        positionals="\n".join(pos_cases),
    )  # fmt: skip


BASH = """# treb completion (bash); load with: eval "$(treb completion bash)"
_treb_files() {{
    local IFS=$'\\n'
    COMPREPLY+=($(compgen -f -- "$cur"))
    compopt -o filenames 2>/dev/null
}}
_treb() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local verb="" flags="" vflags="" at=1 n=0 i
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) ;; *) verb="${{COMP_WORDS[i]}}"; at=$i; break;; esac
    done
    if [[ -z "$verb" ]]; then
        COMPREPLY=($(compgen -W "{verbs} --version --help" -- "$cur"))
        return
    fi
    case "$verb:$prev" in
{values}
    esac
    case "$verb" in
{flags}
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
        return
    fi
    for ((i = at + 1; i < COMP_CWORD; i++)); do  # positionals typed so far
        [[ "${{COMP_WORDS[i]}}" == -* ]] && continue
        [[ "$vflags" == *" ${{COMP_WORDS[i-1]}} "* ]] && continue
        ((n++))
    done
    case "$verb:$n" in
{positionals}
    esac
}}
complete -F _treb treb
"""

ZSH = """#compdef treb
# treb completion (zsh, through bashcompinit); load with: eval "$(treb completion zsh)"
autoload -U +X compinit && compinit
autoload -U +X bashcompinit && bashcompinit
{bash}"""


def fish(vs: dict[str, Verb]) -> str:
    lines = [
        "# treb completion (fish); load with: treb completion fish | source",
        "complete -c treb -f",
        f"complete -c treb -n __fish_use_subcommand -a '{' '.join(vs)}'",
    ]
    for name, v in vs.items():
        cond = f"-n '__fish_seen_subcommand_from {name}'"
        for flag in v.flags:
            opt = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
            kind = v.values.get(flag)
            if kind is None:
                lines.append(f"complete -c treb {cond} {opt}")
                continue
            need = "-r" if "files" in kind.split() else "-x"  # -x: a value, not a file
            lines.append(f"complete -c treb {cond} {opt} {need} {_fish_args(kind)}")
        for kind in v.positionals[:1]:  # fish: the first positional's words
            lines.append(f"complete -c treb {cond} {_fish_args(kind)}")
    return "\n".join(lines) + "\n"


def _fish_args(kind: str) -> str:
    words = _candidates(kind, f"({IDS})")
    out = f'-a "{words}"' if words else ""
    return (out + " -F").strip() if "files" in kind.split() else out


def main(args: argparse.Namespace) -> int:
    from trebuchet.cli.main import build_parser

    vs = verbs(build_parser())
    if args.shell == "bash":
        print(bash(vs), end="")
    elif args.shell == "zsh":
        print(ZSH.format(bash=bash(vs)), end="")
    else:
        print(fish(vs), end="")
    return 0
