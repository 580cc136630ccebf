"""`treb fault` on Slurm: the runtime's fault verb in an `srun --overlap` step of the job on
the node (beside the ranks' step, which holds the node's CPUs); preempt is Slurm's own
requeue."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.errors import UserError
from trebuchet.runtime.node import fault

if TYPE_CHECKING:
    from trebuchet.store.db import RunRecord

STEP_TIMEOUT_S = 120.0


def nodes(run: RunRecord) -> list[str]:
    """The latest attempt's nodes (attempt.json's hostlist, expanded by Slurm itself)."""
    nodelist = str(fault.attempt_file(run.run_dir, "attempt.json").get("nodes") or "")
    if not nodelist:
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    return out.stdout.split()


def _runtime(run_dir: Path) -> str:
    found = sorted(run_dir.glob("treb-runtime-*.pyz"))
    if not found:
        raise UserError(f"{run_dir}: no runtime archive (treb-runtime-*.pyz)")
    return found[-1].name


def _on_node(run: RunRecord, host: str, words: list[str]) -> int:
    run_dir = Path(run.run_dir)
    runtime = str(run_dir / _runtime(run_dir))
    argv = ["srun", "--overlap", f"--jobid={run.backend_id}", "-w", host, "-N1", "-n1",
            "--quiet", "python3", "-S", runtime, "fault", *words]  # fmt: skip
    return subprocess.run(argv, timeout=STEP_TIMEOUT_S).returncode


def inject(run: RunRecord, action: str, target: str | None, host: str | None) -> int:
    if action == fault.PREEMPT:  # Slurm's own: the job goes back to the queue
        return subprocess.run(["scontrol", "requeue", str(run.backend_id)], timeout=60).returncode
    if action == fault.KILL_NODE:
        assert host is not None
        return _on_node(run, host, [fault.KILL_NODE, run.id, "--job", str(run.backend_id)])
    rank_rec = fault.attempt_file(run.run_dir, f"rank-{int(str(target))}.json")
    if not rank_rec.get("host"):
        return 1
    return _on_node(run, str(rank_rec["host"]), [fault.HANG_RANK, run.run_dir, run.id, str(target)])
