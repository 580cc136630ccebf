"""`treb render`: exactly what `treb run` would launch, secrets masked (runner.render)."""

from __future__ import annotations

import argparse
import sys

from trebuchet import runner


def main(args: argparse.Namespace) -> int:
    sys.stdout.write(runner.render(args.spec, args.on, args.override, multirun=args.sweep))
    return 0
