"""`treb run` without a spec, as torchrun users type it (docs/cli.md "Without a spec").

    treb run [-n P] [--nnodes N] [--on ENGINE] [-o k=v]... -- COMMAND [ARG...]
    treb run [-n P] [--nnodes N] [...] SCRIPT.py [ARG...]      (torchrun's own form)

Which words are the command (one rule, checked in this order):
1. everything after `--`;
2. else, from the first word that is not an option and ends in `.py` (or any such word
   after torchrun's -m, --no-python or --run-path, or with their PET_ variables set): that
   program and every word after it, options included, as torchrun reads them;
3. else the first such word is a SPEC, as always, and the words after it are treb's.
A command whose first word ends in `.py` runs as `python SCRIPT ARG...` (torchrun's
default; `--no-python` runs it as is, `-m` as `python -m MODULE`). A SPEC and a command
together, or an option treb does not know before the command, is refused (exit 2).

The command becomes a spec in memory ({name, command} and the flags as `-o` overrides),
loaded by the same model and checks as a YAML spec (runner.launch), and recorded with the
run as any spec is (the run directory's spec.yaml: `treb rerun`, `status`, `render RUN`).
torchrun's flags (every one of torch 2.13's, cli/torchrun_flags.py) are overrides with a
spec too. `--print-spec` prints the spec as YAML instead of running it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

PYTHON = "python"  # as a spec's `python train.py`: the one on the ranks' PATH


def add_flags(p: argparse.ArgumentParser) -> None:
    """`treb run`'s torchrun flags (torchrun_flags.py; with a spec: overrides of its fields)."""
    from trebuchet.cli import torchrun_flags

    g = p.add_argument_group("torchrun's flags (a launch without a spec; with one: overrides)")
    torchrun_flags.add_flags(g)
    g.add_argument(
        "--print-spec",
        action="store_true",
        help="print the spec this launch makes, as YAML, and exit without running",
    )
    p.set_defaults(command=None, typed=[])


def verb_parser(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    """The parser of one verb, as add_subparsers made it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[verb]
    raise KeyError(verb)


def _option(p: argparse.ArgumentParser, word: str) -> tuple[argparse.Action | None, bool]:
    """The action of an option word and whether its value is inside the word
    (`--nnodes=2`, `-n2`); a unique prefix of a long option is that option, as argparse
    has it. (None, _): not an option of `treb run`."""
    table = p._option_string_actions
    if word.startswith("--"):
        name, eq, _ = word.partition("=")
        if name in table:
            return table[name], bool(eq)
        found = {table[o] for o in table if o.startswith(name) and o.startswith("--")}
        return (found.pop(), bool(eq)) if len(found) == 1 else (None, False)
    if word[:2] in table:
        return table[word[:2]], len(word) > 2
    return None, False


def _unknown(p: argparse.ArgumentParser, word: str) -> str:
    name = word.partition("=")[0]
    import difflib

    known = [o for o in p._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return (
        f"{name}: not an option of treb run{hint}; a command's own options go after it "
        "(treb run train.py --lr 1) or after -- (treb run -- CMD --opt)"
    )


def split(p: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], list[str] | None]:
    """(`run` and treb's words, the command or None): the rule in this module's doc."""
    from trebuchet.cli.torchrun_flags import PROGRAM_FLAGS, pet_switch

    head, spec, i = [words[0]], None, 1
    # -m, --no-python, --run-path (or their PET_ variables): the first word is the program
    program = any(pet_switch(d) for d in PROGRAM_FLAGS)
    while i < len(words):
        word = words[i]
        if word == "--":
            command = words[i + 1 :]
            if spec is not None:
                p.error(f"{spec} and a command after --: give a spec or a command, not both")
            if not command:
                p.error("nothing after --: give the command, e.g. treb run -n 2 -- python x.py")
            return head, command
        if word.startswith("-") and word != "-":
            action, inline = _option(p, word)
            if action is None:
                p.error(_unknown(p, word))
            head.append(word)
            program = program or action.dest in PROGRAM_FLAGS
            if action.nargs != 0 and not inline and i + 1 < len(words):
                head.append(words[i + 1])
                i += 1
            i += 1
            continue
        if spec is None and not program and not word.lower().endswith(".py"):
            spec = word
            head.append(word)
            i += 1
            continue
        if spec is not None:
            p.error(
                f"{spec} and {word}: give a spec (.yaml) or a command, not both; a command "
                "that is not a .py script goes after --: treb run -n 2 -- CMD ARG..."
            )
        return head, words[i:]
    if spec is None and not any(w in ("-h", "--help") for w in head):
        p.error("give a spec (treb run job.yaml) or a command (treb run -n 2 train.py, "
                "or treb run -n 2 -- CMD ARG...)")  # fmt: skip
    return head, None


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """torchrun's flags as `-o` overrides (they apply to a spec too); notes on stderr; the
    translation kept on `args.torchrun` for build() and the terminal view."""
    from trebuchet.cli import torchrun_flags

    specless = getattr(args, "command", None) is not None
    t = torchrun_flags.translate(args, getattr(args, "on", None), specless)
    args.torchrun = t
    torchrun_flags.say(t.notes)
    os.environ.update(t.env)  # the terminal view (view/live.py) and the plan read these
    return t.overrides


def usage(text: str) -> Exception:
    from trebuchet.errors import UserError

    return UserError(text)


def _script(command: list[str]) -> str | None:
    """The Python script a command runs (`x.py ...`, `python x.py ...`), if it names one."""
    first = os.path.basename(command[0])
    if command[0].lower().endswith(".py"):
        return command[0]
    if first.startswith("python") and len(command) > 1 and command[1].lower().endswith(".py"):
        return command[1]
    return None


# Engines whose ranks run in a copy of this folder made elsewhere (no shared file system
# assumed): a script outside it is not there.
SHIPPED = ("ssh", "kubernetes", "skypilot")


def _inside(path: str, folder: str) -> bool:
    """`path` (relative to `folder`, or absolute) is in `folder` or below it, where it
    really is: the run's copy keeps a symlink as it is, so `link.py -> ../other/train.py`
    (or `sub/train.py` with `sub -> ../other`) leads nowhere there and is outside."""
    here = os.path.realpath(folder)
    return os.path.commonpath([here, os.path.realpath(os.path.join(here, path))]) == here


def _outside(script: str, on: str | None) -> str:
    """A script outside this folder (`../other/train.py`): the ranks run in the run's copy
    of this folder, where a relative path to it leads nowhere. torchrun runs it from where
    it is, and so does treb, by its absolute path (this machine's, or a shared file
    system's on Slurm); where the code travels to other machines it is refused."""
    where = os.path.realpath(script)
    if on in SHIPPED:
        raise usage(
            f"{script} is outside this folder ({os.getcwd()}), which is what --on {on} sends "
            f"to the nodes: run treb from a folder that holds it (cd {os.path.dirname(where)} "
            f"&& treb run {os.path.basename(where)}), or copy it here"
        )
    print(f"treb: note: {script} is outside this folder (the run's copy of it holds what "
          f"is here): it runs from {where}, as it is when each rank starts",
          file=sys.stderr)  # fmt: skip
    return where


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The spec of a command, as the fields a YAML spec would have (workdir: here)."""
    from trebuchet.cli.torchrun_flags import Translated, wrap_command
    from trebuchet.spec.load import default_name

    t: Translated = getattr(args, "torchrun", None) or Translated(
        mode="as-is" if getattr(args, "no_python", False) else "python")  # fmt: skip
    from trebuchet.launcher.outputs import in_place  # runs in this folder, as torchrun

    here = in_place(getattr(args, "on", None), os.getcwd())
    command = list(args.command)
    if t.mode == "module":  # torchrun -m: python -m MODULE ARG...
        name = default_name(Path(command[0].rsplit(".", 1)[-1]))
        return {"name": name, "command": wrap_command(t, [PYTHON, "-m", *command]), **here}
    script = _script(command) if t.mode != "as-is" or command[0].lower().endswith(".py") else None
    if t.mode == "run-path":
        script = command[0]
    if script is not None and not os.path.isfile(script):
        raise usage(
            f"{script}: no such file in {os.getcwd()} (the command runs in this folder, "
            "copied for the run: the spec's workdir)"
        )
    if script is not None and not _inside(script, os.getcwd()):
        command[command.index(script)] = _outside(script, getattr(args, "on", None))
    if t.mode in ("python", "run-path") and (t.mode == "run-path"
                                             or command[0].lower().endswith(".py")):  # fmt: skip
        command = [PYTHON, *command]
    if script is not None:
        name = default_name(Path(script))
    elif len(command) > 2 and command[1] == "-m":
        name = default_name(Path(command[2].rsplit(".", 1)[-1]))
    else:
        name = default_name(Path(os.path.basename(command[0])))
    return {"name": name, "command": wrap_command(t, command), **here}


def spec_yaml(data: dict[str, Any], validated: dict[str, Any], typed: list[str]) -> str:
    """The spec to keep: the fields given (command, flags, -o), with their validated values."""
    import yaml

    from trebuchet.spec.dump import comment_words, shell_word

    def pick(raw: Any, value: Any) -> Any:
        if isinstance(raw, dict) and isinstance(value, dict):
            return {k: pick(v, value[k]) for k, v in raw.items() if k in value}
        if isinstance(raw, str) and "${" in raw:
            return raw  # expanded at each load, from the shell that loads it
        return value

    kept = {k: pick(v, validated[k]) for k, v in data.items() if k in validated}
    # Each comment stays one line of printable text whatever was typed (dump.comment_words):
    # a line break in it would end the comment and the rest would be read as YAML.
    typed_line = comment_words(["treb", *typed])
    here = os.getcwd()
    here = here if here.isprintable() else shell_word(here)
    head = (
        f"# {typed_line}\n"
        f"# as a spec: its workdir (.) is the folder this file is saved in, so save it in\n"
        f"# {here} and run `treb run FILE.yaml` (docs/spec.md has every field)\n"
    )
    return head + yaml.safe_dump(kept, sort_keys=False, default_flow_style=False)


def print_spec(args: argparse.Namespace, data: dict[str, Any], overrides: list[str]) -> int:
    """--print-spec: check it as `treb run` would (engine included), print it, run nothing."""
    from trebuchet import runner
    from trebuchet.spec.load import apply_overrides
    from trebuchet.spec.source import Located

    if args.sweep:
        raise usage("--print-spec and --sweep: print the spec, then add a sweep: block to it")
    checked = runner.check(data, args.on, overrides, preflight=not args.no_check,
                           warn=lambda t: print(f"treb: {t}", file=sys.stderr))  # fmt: skip
    merged = Located(data={k: v for k, v in data.items()})
    apply_overrides(merged, overrides)
    validated = checked.points[0][1].spec.model_dump(mode="json")
    sys.stdout.write(spec_yaml(merged.data, validated, args.typed))
    return 0
