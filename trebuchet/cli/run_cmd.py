"""`treb run`: the runner's launch (runner.py), with what the terminal shows around it."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from trebuchet import runner
from trebuchet.backends.base import SweepSubmitted
from trebuchet.cli.supervise import HOOKS

if TYPE_CHECKING:
    from trebuchet.launcher.submit import Submission


def warn(text: str) -> None:
    for line in text.splitlines():
        print(f"treb: {line}", file=sys.stderr)


def announce(sub: Submission) -> None:
    """An attached run, once recorded: what is about to run, and where its files go."""
    rec = sub.record
    print(f"treb: run {rec.id} ({rec.name}): {rec.nodes} node(s) x {rec.procs_per_node} "
          f"{rec.launcher} on {rec.backend}; run dir {sub.run_dir}", file=sys.stderr)  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from trebuchet.cli import specless

    overrides = specless.flag_overrides(args) + list(args.override)
    overrides += [f"name={args.name}"] if args.name else []
    source: runner.Source = args.spec
    if getattr(args, "command", None) is not None:  # treb run [-n P] -- COMMAND (specless.py)
        source = specless.build(args)
        if args.print_spec:
            return specless.print_spec(args, source, overrides)
    elif getattr(args, "print_spec", False):
        raise specless.usage("--print-spec prints the spec a command makes; a spec file is "
                             "one already (as it ran: the run directory's spec.yaml)")  # fmt: skip
    elif getattr(args, "no_python", False) or getattr(args, "run_path", False):
        raise specless.usage("--no-python and --run-path apply to a command, not to a spec")
    elif getattr(args, "module", False):
        raise specless.usage("-m/--module (torchrun's) applies to a command: treb run -m "
                             "MODULE ARG...; a sweep is --sweep (or --multirun)")  # fmt: skip
    started = runner.launch(
        source, args.on, overrides, attach=not args.detach, preflight=not args.no_check,
        multirun=args.sweep, warn=warn, announce=None if args.detach else announce, handover=HOOKS,
        resume_from=args.resume_from, after=getattr(args, "after", None) or (),
    )  # fmt: skip
    result = started.result
    if isinstance(result, SweepSubmitted):
        if args.detach:
            print(result.sweep_id)
        elif not result.cancel_signal:
            print(f"treb: sweep {result.sweep_id}: {result.runs - (result.failed or 0)} of "
                  f"{result.runs} runs succeeded", file=sys.stderr)  # fmt: skip
        return runner.exit_code(result)
    sub = started.subs[0]
    rec = sub.record
    if args.detach or sub.loaded.after:  # --after: detached, as it may wait long
        print(rec.id)
        if result.state is not None:  # decided at once: a run it waits for failed already
            print(f"treb: run {rec.id} ({rec.name}) {result.state}: not started",
                  file=sys.stderr)  # fmt: skip
            return 1
        print(f"treb: run {rec.id} ({rec.name}) started in the background; "
              f"follow it with `treb logs -f {rec.id}`", file=sys.stderr)  # fmt: skip
        return 0
    from trebuchet.cli.report import attached_end

    return attached_end(sub.store, result, sub.run_dir, sub.loaded.spec.profile)
