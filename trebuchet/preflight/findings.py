"""The Finding type and the list of every check id (the ids users put in `ignore_checks`)."""

from __future__ import annotations

from trebuchet.plain import asdict, record

ERROR = "error"
WARNING = "warning"

# Every id a shared check or a built-in engine's checks (backends/slurm/checks.py) can
# report, with what it catches (docs/preflight.md has the long form); an engine from
# elsewhere declares its own ids (Backend.check_ids).
CHECKS: dict[str, str] = {
    "node-local-cache": "a cache or data path each node of a multi-node run has its own copy of",
    "node-local-workdir": "a workdir the compute nodes cannot see (snapshot: false)",
    "node-local-treb-home": "TREB_HOME on a node-local disk while runs go to Slurm",
    "mount-missing": "a container mount source that does not exist on the submitting host",
    "workdir-missing": "a workdir that does not exist on the submitting host",
    "secret-unset": "a secret listed in the spec but not set in the submitting shell",
    "time-limit-short": "a time limit that leaves no room for the checkpoint warning",
    "partition-too-small": "more nodes, or GPUs per node, than the Slurm partition has",
    "unknown-partition": "a Slurm partition that sinfo does not know",
    "parallel-size-mismatch": "model-parallel sizes that do not divide the world size",
    "torchrun-nnodes-mismatch": "torchrun --nnodes in the command differs from the spec's nodes",
    "launcher-in-command": "a launcher in the command under launcher native or mpirun",
    "launcher-in-torchrun": "a launcher in the command under launcher torchrun",
    "no-launcher-for-procs": "launcher none, procs_per_node > 1, nothing starts the ranks",
    "horovod-build": "a horovod built without PyTorch or the controller the spec asks for",
    "node-environment-missing": "bare SkyPilot/Kubernetes nodes get no environment or image "
    "the command needs",
    "checkpoints-node-local": "a recovered SkyPilot/Kubernetes job would lose node-local "
    "checkpoints",
    "gpus-unused": "skypilot.accelerators gives more GPUs per node than the ranks use",
    "ssh-hosts-unused": "ssh hosts listed beyond `nodes`, which the run does not use",
    "ssh-setup-syntax": "ssh.setup lines bash cannot parse",
    "unknown-check-id": "an ignore_checks entry that names no check",
    "trainer-requeues-itself": "a trainer that requeues its Slurm job (Lightning, submitit) "
    "with a checkpoint signal it does not handle, or no retries left for its requeue",
}  # fmt: skip


@record(frozen=True)
class Finding:
    """One problem: a stable id, error or warning, what is wrong, how to fix it, where."""

    id: str
    severity: str
    message: str
    fix: str
    where: str

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def text(self) -> str:
        """`file:line: severity: message [id]` and the fix on the next line."""
        return f"{self.where}: {self.severity}: {self.message} [{self.id}]\n  fix: {self.fix}"


def count(findings: list[Finding]) -> str:
    """'1 error, 2 warnings'."""
    errors = sum(f.is_error for f in findings)
    warnings = len(findings) - errors
    parts = [f"{errors} error{'s' if errors != 1 else ''}"] if errors else []
    parts += [f"{warnings} warning{'s' if warnings != 1 else ''}"] if warnings else []
    return ", ".join(parts) or "no problems found"
