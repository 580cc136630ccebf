"""Trainers that requeue their own Slurm job (`trainer-requeues-itself`).

Lightning (auto_requeue, on SIGUSR1) and submitit (SIGUSR2) save a checkpoint and run
`scontrol requeue` from rank 0; the job controller makes that requeue its own
(runtime/job/selfrequeue.py). What can still go wrong is in the spec: a checkpoint signal
the trainer does not handle, or `retries: 0` (the requeue is refused). Found from the
command's Python script and its top-level imports; a script that turns it off is left alone.
"""

from __future__ import annotations

import re

from trebuchet.preflight.bare_nodes import third_party_imports
from trebuchet.preflight.command import command_text, python_script, script_bytes, words
from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import WARNING, Finding

# top-level module -> (what requeues, the signal it handles by default)
TRAINERS = {
    "lightning": ("Lightning's SLURM auto-requeue", "SIGUSR1"),
    "pytorch_lightning": ("Lightning's SLURM auto-requeue", "SIGUSR1"),
    "submitit": ("submitit's checkpoint-and-requeue", "SIGUSR2"),
}
AUTO_REQUEUE_OFF = re.compile(r"auto_requeue\s*=\s*False")
REQUEUE_SIGNAL = re.compile(r"requeue_signal\s*=\s*(?:signal\.)?(?:Signals\.)?(SIG[A-Z0-9]+)")


def self_requeue(ctx: Context) -> list[Finding]:
    if not ctx.engine.slurm_environment:  # only Slurm's environment turns these handlers on
        return []
    ws = words(command_text(ctx.spec.command))
    workdir = ctx.loaded.workdir
    found = [m for m in third_party_imports(ws, workdir) if m in TRAINERS]
    if not found:
        return []
    script = python_script(ws)
    data = script_bytes(script, workdir) if script else None
    text = data.decode(errors="replace") if data else ""
    if AUTO_REQUEUE_OFF.search(text):
        return []
    who, signal = TRAINERS[found[0]]
    m = REQUEUE_SIGNAL.search(text)
    signal = m.group(1) if m else signal
    spec = ctx.spec
    out: list[Finding] = []
    if spec.checkpoint_signal != signal:
        out.append(ctx.finding(
            "trainer-requeues-itself", WARNING,
            f"the command uses {who}, which saves its checkpoint and requeues the job on "
            f"{signal}; the spec's checkpoint signal is {spec.checkpoint_signal}, so it will "
            "not checkpoint before the time limit",
            f"set `checkpoint_signal: {signal}` (as `#SBATCH --signal={signal[3:]}@90` would); "
            "trebuchet then makes the trainer's requeue its own, once per attempt",
            "checkpoint_signal",
        ))  # fmt: skip
    if spec.retries == 0:
        out.append(ctx.finding(
            "trainer-requeues-itself", WARNING,
            f"the command uses {who}, which requeues the job before its time limit; with "
            "`retries: 0` no attempt is left for it, so the requeue is refused and the run "
            "ends at the limit",
            "set `retries:` to the number of requeues to allow (each one is an attempt)",
            "retries",
        ))  # fmt: skip
    return out
