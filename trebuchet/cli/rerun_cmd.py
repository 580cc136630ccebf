"""`treb rerun RUN`: a new run from an earlier run's resolved spec (spec.yaml, overrides
applied), through `treb run` so every check and refusal is the same; its code the earlier
run's snapshot unless --current-code."""

from __future__ import annotations

import argparse

from trebuchet.errors import UserError
from trebuchet.runtime.rundir.records import read_json
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import run_dir


def source(rec: RunRecord, current_code: bool = False) -> tuple[str, list[str]]:
    """The earlier run's spec file and the overrides a rerun starts from (`treb rerun`, the
    dashboard's rerun button: both then launch through runner.launch)."""
    spec = run_dir(rec.id) / "spec.yaml"
    if not spec.is_file():
        raise UserError(f"run {rec.id}: {spec} is gone, so it cannot be rerun")
    extra = []
    if current_code:
        facts = read_json(str(run_dir(rec.id) / "snapshot.json"))  # a rank's FIFO: None
        # None: snapshot: false, the workdir in the spec is the user's already
        workdir = facts.get("source") if isinstance(facts, dict) else None
        workdir = workdir if isinstance(workdir, str) else None
        extra = [f"workdir={workdir}"] if workdir else []
    return str(spec), extra


def main(args: argparse.Namespace) -> int:
    rec = Store().resolve(args.run)
    spec, extra = source(rec, args.current_code)
    from trebuchet.cli import run_cmd

    args.spec, args.on = spec, args.on or rec.backend
    args.override = [*extra, *args.override]
    return run_cmd.main(args)
