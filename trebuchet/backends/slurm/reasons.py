"""Why a Slurm job is still pending, in plain words, and whether it can ever start.

Why: a job that asks for more than its partition has (5 nodes of a 2-node partition)
is accepted by sbatch and then waits forever; squeue's reason code (%r) says so, but
only to someone who knows the codes. The run keeps {"reason", "meaning", "starts"}
(RunRecord.waiting) and `treb ps`, `treb status` and the attached view show it. Only
the reasons that name a partition limit ask Slurm for the partition's facts (one
`scontrol show partition`, and only when the reason first appears).
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

# Reasons under which the job will not start as things are (an administrator, or a
# new submission, must change something).
BLOCKED = {
    "PartitionConfig": "no node of partition {partition} can hold what the job asks per node "
    "(CPUs, memory or GPUs)",
    "PartitionDown": "partition {partition} is down",
    "PartitionInactive": "partition {partition} is inactive",
    "BadConstraints": "no node matches the job's constraints (slurm.constraint, --gres, "
    "memory or CPUs per node)",
    "InvalidAccount": "the account is not valid for this user (slurm.account)",
    "InvalidQOS": "the QOS is not valid for this user or account (slurm.qos)",
    "QOSNotAllowed": "the QOS is not allowed in partition {partition} (slurm.qos)",
    "AccountNotAllowed": "the account is not allowed in partition {partition} (slurm.account)",
    "DependencyNeverSatisfied": "a job it depends on ended in a way that can never satisfy "
    "the dependency",
    "JobHeldAdmin": "an administrator holds it (it starts after `scontrol release`)",
    "JobHeldUser": "it is held (it starts after `scontrol release JOBID`)",
    "launch failed requeued held": "its launch failed and Slurm holds it (`scontrol release`)",
}
# Reasons under which the job waits for something that comes by itself.
WAITING = {
    "Resources": "waiting for free nodes",
    "Priority": "waiting: jobs with higher priority go first",
    "Dependency": "waiting for the jobs it depends on",
    "BeginTime": "waiting for its begin time",
    "NodeDown": "waiting: a node it needs is down",
    "Reservation": "waiting for its reservation to start",
    "Licenses": "waiting for licenses",
    "JobArrayTaskLimit": "waiting: the sweep's array runs at most its limit of tasks at once",
    "Cleaning": "waiting while Slurm cleans up a previous run of it (requeued)",
    "BurstBufferResources": "waiting for burst buffer space",
    "FrontEndDown": "waiting: no front end node is up",
    "PowerUpNode": "waiting for its nodes to power up",
    "Prolog": "its prolog is running",
    "ReqNodeNotAvail": "waiting: a node it needs is in use or reserved",
}
# Per-job limits of a QOS or association: the job asks for more than one job may have.
PER_JOB_LIMIT = re.compile(r"^(QOS|Assoc)(Max|Min)\w*(PerJob|PerJobLimit)$")
# Group, per-user or per-account limits: it starts when other jobs of the account end.
SHARED_LIMIT = re.compile(r"^(QOS|Assoc)\w*(Grp|PerUser|PerAccount|JobLimit|ResourceLimit)")
PARTITION_LIMITS = ("PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig")
UNAVAILABLE = re.compile(r"UnavailableNodes:(\S+)")


def partition_facts(partition: str, timeout: float = 10.0) -> dict[str, str] | None:
    """`scontrol show partition NAME --oneliner` as {key: value}; None if it cannot say."""
    if not partition or "," in partition:  # several partitions: no single set of limits
        return None
    cmd = ["scontrol", "show", "partition", partition, "--oneliner"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    pairs = (part.split("=", 1) for part in res.stdout.split() if "=" in part)
    return {key: value for key, value in pairs}


def _node_limit(partition: str, nodes: int, facts: dict[str, str] | None) -> str:
    total = (facts or {}).get("TotalNodes", "")
    most = (facts or {}).get("MaxNodes", "")
    least = (facts or {}).get("MinNodes", "")
    if total.isdigit() and nodes > int(total):
        return f"partition {partition} has {total} nodes, the job asks for {nodes}"
    if most.isdigit() and nodes > int(most):
        return f"partition {partition} allows at most {most} nodes a job, the job asks for {nodes}"
    if least.isdigit() and nodes < int(least):
        return f"partition {partition} wants at least {least} nodes a job, the job asks for {nodes}"
    return (f"the job asks for {nodes} nodes, outside partition {partition}'s limits or more "
            f"than it has up (see `sinfo -p {partition}`)")  # fmt: skip


def _time_limit(partition: str, asked: str, facts: dict[str, str] | None) -> str:
    most = (facts or {}).get("MaxTime", "")
    allows = f" ({most})" if most else ""
    return (
        f"the job asks for {asked or 'more time'}, more than partition {partition} allows{allows}"
    )


def explain(
    reason: str, partition: str = "", nodes: int = 1, time_limit: str = "",
    facts: dict[str, str] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """{"reason", "meaning", "starts"} for squeue's reason; None when there is nothing to say
    (no reason yet). starts is False when the job will not start as things are."""
    reason = reason.strip()
    if reason in ("", "None"):
        return None
    code = reason.split(",")[0].strip()
    part = partition or "?"
    starts = False
    total = (facts or {}).get("TotalNodes", "")
    if code == "PartitionNodeLimit" or (
        code == "PartitionConfig" and total.isdigit() and nodes > int(total)
    ):
        meaning = _node_limit(part, nodes, facts)
    elif code == "PartitionTimeLimit":
        meaning = _time_limit(part, time_limit, facts)
    elif code in BLOCKED:
        meaning = BLOCKED[code].format(partition=part, nodes=nodes)
    elif code == "ReqNodeNotAvail" and (down := UNAVAILABLE.search(reason)):
        meaning = f"nodes it needs are down, drained or not responding: {down.group(1)}"
    elif PER_JOB_LIMIT.match(code):
        meaning = "it asks for more than one job may have under its QOS or account's limits"
    elif code in WAITING:
        meaning, starts = WAITING[code], True
    elif SHARED_LIMIT.match(code):
        meaning = "waiting: its account or QOS is at a limit; it starts when other jobs end"
        starts = True
    else:
        meaning = "waiting (see `scontrol show job` and Slurm's squeue reason codes)"
        starts = True
    if not starts:
        meaning = f"will not start: {meaning}"
    return {"reason": reason, "meaning": meaning, "starts": starts, "source": "Slurm"}


def needs_facts(reason: str) -> bool:
    """Whether explain() says more with the partition's facts."""
    return reason.split(",")[0].strip() in PARTITION_LIMITS
