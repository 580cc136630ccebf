"""`treb render SPEC | RUN`: exactly what `treb run` would launch, secrets masked
(runner.render); a RUN: what its recorded spec would launch now."""

from __future__ import annotations

import argparse
import os
import sys

from trebuchet import runner


def run_spec(ref: str) -> str | None:
    """`treb render RUN`: the run's recorded spec (spec.yaml, as it ran: also a run started
    without a spec file); None when `ref` is a file or names no run."""
    if os.path.exists(ref) or ref.lower().endswith((".yaml", ".yml")):
        return None
    from trebuchet.errors import UserError
    from trebuchet.store.db import Store
    from trebuchet.store.paths import home_path, run_dir

    if not os.path.exists(os.path.join(home_path(), "runs.db")):
        return None
    try:
        rec = Store().resolve(ref)
    except UserError:
        return None
    path = run_dir(rec.id) / "spec.yaml"
    return str(path) if path.is_file() else None


def main(args: argparse.Namespace) -> int:
    spec = run_spec(args.spec) or args.spec
    sys.stdout.write(runner.render(spec, args.on, args.override, multirun=args.sweep,
                                   after=getattr(args, "after", None) or ()))  # fmt: skip
    return 0
