"""`treb import KIND FILE`: write a spec to stdout; on stderr, every part not carried over."""

from __future__ import annotations

import argparse
import os
import re
import sys

from trebuchet.errors import SpecError, TrebError, UserError
from trebuchet.importers import importer
from trebuchet.importers.common import ImportResult


def check_loads(text: str) -> None:
    """The imported spec must load: a failure here is a bug in the importer, not bad input."""
    from trebuchet.spec.load import load_spec

    # ${VAR} references are expanded at submission; give them a value for this check only.
    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    environ = {**{n: "x" for n in names}, **os.environ}
    try:
        load_spec(text=text, environ=environ)
    except SpecError as exc:
        raise TrebError(
            "the imported spec does not load (a bug in treb import):\n" + "\n".join(exc.problems)
        ) from None


def refuse_unholdable(res: ImportResult) -> None:
    """A value of the input that no command line, environment or path can hold (a NUL, a
    lone surrogate: YAML's "\\0" and "\\ud800" escapes) is the input's fault: exit 2 naming
    the spec field it would have become, by the loader's own rule."""
    from trebuchet.spec.source import dotted
    from trebuchet.spec.validate import _bad_text

    problems = [f"{res.source}: {dotted(path)}: {why}" for path, why in _bad_text(res.spec, ())]
    if problems:
        raise UserError("\n".join(problems))


def main(args: argparse.Namespace) -> int:
    tags = [t for arg in args.tags for t in arg.split(",") if t]
    res = importer(args.kind).import_file(args.file, tags=tags, recipe=args.recipe)
    refuse_unholdable(res)
    text = res.to_yaml()
    check_loads(text)
    sys.stdout.write(text)
    for line in res.messages():
        print(f"treb import: {line}", file=sys.stderr)
    return 0
