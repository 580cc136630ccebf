"""`treb check --nodes N` on Slurm: one `srun -N N --ntasks-per-node=1` task per node runs
the runtime's `health` verb against a folder under TREB_HOME (which the nodes share, as
they share run directories), with a token file written there: a node that reads another
token, or none, does not see the shared folder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError

SRUN_TIMEOUT_S = 600.0
WAIT_S = 60  # srun --immediate: N free nodes within this, else no check (exit 2, said why)


def check(folder: Path, n: int, spec: Any, token: str) -> list[dict[str, Any]]:
    from trebuchet.launcher.runtime_file import ship

    runtime = ship(folder)
    argv = ["srun", f"--nodes={n}", "--ntasks-per-node=1", "--quiet",
            f"--immediate={WAIT_S}", f"--job-name=treb-check-{folder.name}"]  # fmt: skip
    partition = getattr(getattr(spec, "slurm", None), "partition", None)
    if partition:
        argv.append(f"--partition={partition}")
    argv += ["python3", "-S", str(runtime), "health", str(folder), token]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=SRUN_TIMEOUT_S)
    except FileNotFoundError:
        raise UserError("treb check --nodes --on slurm: srun is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"treb check --nodes: srun gave no answer in {SRUN_TIMEOUT_S:g}s") from None
    found = []
    for line in res.stdout.splitlines():
        if line.startswith("treb-health "):
            try:
                found.append(json.loads(line.split(" ", 1)[1]))
            except ValueError:
                continue
    if not found:
        said = (res.stderr.strip().splitlines() or [f"srun exited {res.returncode}"])[-1]
        raise UserError(f"treb check --nodes {n} --on slurm: no node answered: {said}")
    return sorted(found, key=lambda r: int(r.get("node") or 0))
