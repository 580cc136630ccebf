"""`treb render`: exactly what `treb run` would launch, secrets masked."""

from __future__ import annotations

import argparse
import sys

from trebuchet.backends import get_backend
from trebuchet.launcher import sweep
from trebuchet.spec.load import load_spec


def main(args: argparse.Namespace) -> int:
    fixed, axes = sweep.points(args.override, None)
    loaded = load_spec(args.spec, fixed)
    backend = get_backend(args.on)
    if not loaded.spec.sweep and axes == [{}]:
        sys.stdout.write(backend.render(loaded))
        return 0
    # A sweep: what each of its runs would launch, as `treb run` would start them.
    from trebuchet.cli.sweep_run import point_specs

    points = sweep.points(args.override, loaded.spec.sweep)[1]
    specs = point_specs(args.spec, fixed, points, args.on)
    if args.on == "slurm":
        parallel = specs[0][1].spec.sweep_parallel
        limit = f", at most {parallel} at once" if parallel else ""
        sys.stdout.write(f"# sweep: {len(specs)} runs, submitted as one Slurm job array"
                         f"{limit}; array task i runs point i's script below\n")  # fmt: skip
    for i, (point, one) in enumerate(specs):
        params = ", ".join(f"{k}={v}" for k, v in point.items())
        sys.stdout.write(f"# ==== sweep point {i} (of {len(specs)}): {params}\n")
        sys.stdout.write(backend.render(one))
    return 0
