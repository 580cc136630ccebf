"""`treb run`: validate, record, launch; attached runs stream logs until the end."""

from __future__ import annotations

import argparse
import sys

from trebuchet.backends import get_backend
from trebuchet.launcher import sweep
from trebuchet.launcher.submit import prepare
from trebuchet.spec.load import load_spec
from trebuchet.store.db import Store
from trebuchet.store.states import EXIT_CODES


def main(args: argparse.Namespace) -> int:
    overrides = list(args.override) + ([f"name={args.name}"] if args.name else [])
    fixed, axes = sweep.points(overrides, None)
    loaded = load_spec(args.spec, fixed)
    backend = get_backend(args.on)
    if not args.no_check:
        from trebuchet.preflight import enforce

        enforce(loaded, args.on)  # prints warnings; errors: exit 2 before anything is recorded
    if loaded.spec.sweep or axes != [{}]:
        from trebuchet.cli.sweep_run import run_sweep

        return run_sweep(args, fixed, sweep.points(overrides, loaded.spec.sweep)[1])
    backend.check(loaded)
    store = Store()
    sub = prepare(loaded, args.on, store)
    for warning in sub.warnings:
        print(f"treb: warning: {warning}", file=sys.stderr)
    rec = sub.record
    if args.detach:
        backend.submit(sub, attach=False)
        print(rec.id)
        print(f"treb: run {rec.id} ({rec.name}) started in the background; "
              f"follow it with `treb logs -f {rec.id}`", file=sys.stderr)  # fmt: skip
        return 0
    print(f"treb: run {rec.id} ({rec.name}): {rec.nodes} node(s) x {rec.procs_per_node} "
          f"{rec.launcher} on {args.on}; run dir {sub.run_dir}", file=sys.stderr)  # fmt: skip
    state = backend.submit(sub, attach=True)
    from trebuchet.cli.report import final_summary

    final = store.get(rec.id) or rec
    print(final_summary(store, final), file=sys.stderr)
    if loaded.spec.profile != "none":
        where = sub.run_dir / "profile"
        print(f"treb: profiles ({loaded.spec.profile}) in {where}", file=sys.stderr)
    sig = getattr(backend, "cancel_signal", None)
    if state == "CANCELLED" and sig:
        return 128 + int(sig)
    return EXIT_CODES.get(str(state), 1)
