"""`treb run` of a sweep: one recorded run per point, grouped under a sweep id."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from trebuchet.backends import get_backend
from trebuchet.errors import UserError
from trebuchet.launcher import sweep
from trebuchet.launcher.submit import prepare
from trebuchet.spec.load import LoadedSpec, load_spec
from trebuchet.store.db import Store
from trebuchet.store.files import write_json


def point_specs(
    spec: str, fixed: list[str], points: list[dict[str, str]], on: str
) -> list[tuple[dict[str, str], LoadedSpec]]:
    """Every point's spec, validated before anything is recorded or rendered: a bad value
    fails the whole sweep; on slurm the points are one job array, so one shape."""
    if on not in ("local", "slurm"):
        raise UserError(f"--on {on}: sweeps run on the local and slurm backends only so far")
    specs = [
        (point, load_spec(spec, [*fixed, *(f"{k}={v}" for k, v in point.items()), "sweep=null"]))
        for point in points
    ]
    if on == "slurm":
        from trebuchet.backends.slurm_array import check_shape

        check_shape(specs)
    return specs


def run_sweep(args: argparse.Namespace, fixed: list[str], points: list[dict[str, str]]) -> int:
    specs = point_specs(args.spec, fixed, points, args.on)
    backend = get_backend(args.on)
    for _, loaded in specs:
        backend.check(loaded)
    store = Store()
    sweep_id = sweep.new_sweep_id()
    if args.on == "slurm":
        return _slurm_sweep(args, specs, store, sweep_id)
    parallel = specs[0][1].spec.sweep_parallel or 1
    runs: list[dict[str, Any]] = []
    for index, (point, loaded) in enumerate(specs):
        sub = prepare(loaded, "local", store)
        store.update_run(sub.record.id, sweep_id=sweep_id, params=json.dumps(point, sort_keys=True))
        plan = backend.write_plan(sub)  # type: ignore[attr-defined]
        runs.append({"index": index, "id": sub.record.id, "run_dir": str(sub.run_dir),
                     "params": point, "streams": plan.streams})  # fmt: skip
        for warning in sub.warnings if index == 0 else []:
            print(f"treb: warning: {warning}", file=sys.stderr)
    path = sweep.sweep_file(sweep_id)
    write_json(path, {"id": sweep_id, "parallel": parallel, "runs": runs})
    print(f"treb: sweep {sweep_id}: {len(runs)} runs, at most {parallel} at once", file=sys.stderr)
    for run in runs:
        print(f"treb:   {run['index']}  {run['id']}  {run['params']}", file=sys.stderr)
    if args.detach:
        subprocess.Popen(
            [sys.executable, "-m", "trebuchet.launcher.sweep", str(path)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        print(sweep_id)
        return 0
    failed, sig = sweep.drive(json.loads(path.read_text()), follow=True)
    if sig:
        return 128 + sig
    print(f"treb: sweep {sweep_id}: {len(runs) - failed} of {len(runs)} runs succeeded",
          file=sys.stderr)  # fmt: skip
    return 1 if failed else 0


def _slurm_sweep(args: argparse.Namespace, specs: list, store: Store, sweep_id: str) -> int:
    """All points as one Slurm job array; attached: follow every point until it ends."""
    from trebuchet.backends import slurm_array

    backend = get_backend("slurm")
    parallel = specs[0][1].spec.sweep_parallel  # unset: as many at once as Slurm allows
    subs, runs = [], []
    for index, (point, loaded) in enumerate(specs):
        sub = prepare(loaded, "slurm", store)
        store.update_run(sub.record.id, sweep_id=sweep_id, params=json.dumps(point, sort_keys=True))
        subs.append(sub)
        runs.append({"index": index, "id": sub.record.id, "run_dir": str(sub.run_dir),
                     "params": point})  # fmt: skip
        for warning in sub.warnings if index == 0 else []:
            print(f"treb: warning: {warning}", file=sys.stderr)
    path = sweep.sweep_file(sweep_id)
    job_id = slurm_array.submit(backend, sweep_id, subs, parallel, path.parent)
    write_json(path, {"id": sweep_id, "backend": "slurm", "job_id": job_id,
                      "parallel": parallel, "runs": runs})  # fmt: skip
    at_once = f"at most {parallel} at once" if parallel else "as many at once as Slurm allows"
    print(f"treb: sweep {sweep_id}: {len(runs)} runs, {at_once}", file=sys.stderr)
    for run in runs:
        print(f"treb:   {run['index']}  {run['id']}  {job_id}_{run['index']}  {run['params']}",
              file=sys.stderr)  # fmt: skip
    if args.detach:
        print(sweep_id)
        return 0
    failed, sig = slurm_array.follow(backend, store, job_id, runs)
    if sig:
        return 128 + sig
    print(f"treb: sweep {sweep_id}: {len(runs) - failed} of {len(runs)} runs succeeded",
          file=sys.stderr)  # fmt: skip
    return 1 if failed else 0
