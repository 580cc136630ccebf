"""`--after` between two Slurm runs: Slurm's own job dependency (`--dependency=afterok:<job>`
or `afterany`), so that nothing of treb has to stay alive while B waits; with
`--kill-on-invalid-dep=yes`, a dependency that can never be met (A failed) ends B in
Slurm, and the engine records B CANCELLED with the reason (`dependency RUN failed`).

A Slurm run waits for Slurm runs only: a local or ssh run's end is not a Slurm job
(a local run may wait for a Slurm run: its supervisor polls the index, launcher/waiting.py).
A dependency that has already ended is decided at submission, as Slurm forgets finished
jobs after a while (MinJobAge) and would refuse the job.
"""

from __future__ import annotations

from typing import Any

from trebuchet.errors import UserError
from trebuchet.store import after
from trebuchet.store.db import Store
from trebuchet.store.states import TERMINAL

Dep = dict[str, Any]
KIND = {"ok": "afterok", "any": "afterany"}


def refuse(deps: list[Dep]) -> None:
    """UserError (exit 2) for a dependency Slurm cannot wait for."""
    for d in deps:
        if d.get("backend") != "slurm":
            raise UserError(
                f"--after {d['run']}: a Slurm run waits for Slurm runs only (run {d['run']} "
                f"runs on {d.get('backend')}); run this one where that one runs, or start it "
                "once that run ended"
            )
        if not d.get("job"):
            raise UserError(f"--after {d['run']}: that run has no Slurm job (it never reached "
                            "sbatch)")  # fmt: skip


def sbatch_lines(deps: list[Dep]) -> list[str]:
    """The script's #SBATCH lines for the dependencies still to wait for."""
    if not deps:
        return []
    by: dict[str, list[str]] = {}
    for d in deps:
        by.setdefault(KIND[d.get("when", "ok")], []).append(str(d["job"]))
    spec = ",".join(f"{kind}:{':'.join(jobs)}" for kind, jobs in sorted(by.items()))
    runs = ", ".join(f"{d['run']} ({d.get('name')}) job {d['job']}" for d in deps)
    return [
        f"# --after: {runs}",
        f"#SBATCH --dependency={spec}",
        "#SBATCH --kill-on-invalid-dep=yes",
    ]


def still_waiting(store: Store, deps: list[Dep]) -> tuple[list[Dep], str | None]:
    """At submission: (the dependencies Slurm must still wait for, why the run can never
    start when one already ended otherwise than asked). The index is read as it stands;
    the caller refreshes the active ones first."""
    left: list[Dep] = []
    for d in deps:
        rec = store.get(d["run"])
        if rec is None or rec.state not in TERMINAL:
            left.append(d)
            continue
        _, why = after.verdict(store, [d])
        if why:
            return [], why
    return left, None
