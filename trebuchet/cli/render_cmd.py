"""`treb render`: exactly what `treb run` would launch, secrets masked."""

from __future__ import annotations

import argparse
import sys

from trebuchet.backends import get_backend
from trebuchet.spec.load import load_spec


def main(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec, args.override)
    sys.stdout.write(get_backend(args.on).render(loaded))
    return 0
