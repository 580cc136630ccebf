"""The Slurm engine's own preflight checks (`treb check --on slurm`, `treb run --on slurm`).

- the partition: can it ever hold the job (Determined's users waited forever)? One `sinfo`
  call; when sinfo is missing, slow or failing there is no finding: the checks must never
  fail because Slurm is absent or busy;
- TREB_HOME: the job writes its records below it from the compute nodes;
- slurm.time: the limit an attempt is held to (preflight/timelimit.py checks it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import ERROR, WARNING, Finding
from trebuchet.preflight.storage import LOCAL_ROOTS, under
from trebuchet.spec.duration import slurm_time, unit_seconds

SINFO_TIMEOUT_S = 5.0
GRES_GPU = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")
TIME_ALLOWED = ("a duration (30m, 2h, 1h30m) or a Slurm time (04:00:00, 1-00:00:00, UNLIMITED; "
                "a bare number is minutes)")  # fmt: skip
SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_seconds(text: str) -> float | None:
    """Seconds in slurm.time: a duration with units as `timeout` takes them ("30m", "2h",
    "1h30m"), or a Slurm --time value read as Slurm does (a bare number is minutes); None
    when unlimited; ValueError when it is neither (or a duration of zero)."""
    seconds = unit_seconds(text)
    if seconds is not None:
        if seconds <= 0:
            raise ValueError(text)
        return seconds
    t = text.strip().upper()
    if t in ("UNLIMITED", "INFINITE"):
        return None
    m = SLURM_TIME.fullmatch(t)
    if not m:
        raise ValueError(text)
    d, b, c = (int(x) if x else None for x in m.group(1, 3, 4))
    a = int(m.group(2))  # the group the pattern requires
    if d is not None:  # D-H, D-H:M, D-H:M:S
        return float(d * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0))
    if c is not None:  # H:M:S
        return float(a * 3600 + (b or 0) * 60 + c)
    if b is not None:  # M:S
        return float(a * 60 + b)
    return a * 60.0  # M


def time_arg(text: str) -> str:
    """slurm.time as sbatch's --time: a duration with units in Slurm's D-HH:MM:SS (rounded
    up to whole minutes, as Slurm counts), a Slurm form as written."""
    seconds = unit_seconds(text)
    return slurm_time(seconds) if seconds else text.strip()


def time_limit(spec: Any) -> tuple[float | None, tuple[str, ...]] | None:
    """slurm.time, when set: the job's whole limit, every attempt together (the spec's
    timeout holds each attempt, enforced by the job controller: docs/backends/slurm.md)."""
    if not spec.slurm.time:
        return None
    try:
        seconds = slurm_seconds(spec.slurm.time)
    except ValueError:  # the engine's check reports it
        seconds = None
    return seconds, ("slurm", "time")


def node_local_treb_home(ctx: Context) -> list[Finding]:
    """On Slurm the job writes its records into the run directory below TREB_HOME."""
    raw = ctx.environ.get("TREB_HOME") or str(Path(ctx.environ.get("HOME") or "~") / ".trebuchet")
    home = os.path.abspath(os.path.expanduser(raw))
    if not any(under(home, r) for r in LOCAL_ROOTS):
        return []
    return [
        ctx.finding(
            "node-local-treb-home",
            WARNING,
            f"TREB_HOME={home} is on this host's local disk: the job writes its logs and "
            "records into the run directory below it from the compute nodes, where this "
            "folder is not the same",
            "export TREB_HOME=<a folder on the shared filesystem> before `treb run`",
        )
    ]


def _args_partition(sbatch_args: list[str]) -> str | None:
    """A partition given as a raw sbatch option (-p X, --partition=X, -pX, --part X)."""
    from trebuchet.backends.slurm.argv import parse

    found = [o.value for o in parse(sbatch_args)[0] if o.name == "partition"]
    return found[-1] if found else None


def gres_gpus(gres: str) -> int:
    """GPUs per node in a %G value: 'gpu:a100:8(S:0-1),gpu:v100:2' -> 10, '(null)' -> 0."""
    total = 0
    for entry in re.split(r",(?![^(]*\))", gres):
        m = GRES_GPU.match(entry.strip())
        if m:
            total += int(m.group(1))
    return total


def _sinfo(fmt: str, environ: Mapping[str, str]) -> list[list[str]] | None:
    """sinfo's lines in this format, split at |; None when sinfo is absent or fails."""
    exe = shutil.which("sinfo", path=environ.get("PATH"))
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "-h", "-a", "-o", fmt], capture_output=True, text=True,
            timeout=SINFO_TIMEOUT_S, env=dict(environ), stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    return [line.strip().split("|") for line in res.stdout.splitlines() if line.strip()]


def partitions(environ: Mapping[str, str]) -> list[str] | None:
    """What each partition's nodes have, as sinfo tells now (for a refused job's fix):
    'debug (default): 2 nodes tn[1-2] with 8 CPUs, 21695 MB, no GPUs'."""
    rows = _sinfo("%P|%D|%N|%c|%m|%G|%f", environ)
    out = []
    for parts in rows or []:
        if len(parts) != 7 or not parts[1].isdigit():
            continue
        name, count, nodes, cpus, mem, gres, features = parts
        gpus = gres_gpus(gres)
        text = f"{name.rstrip('*')}{' (default)' if name.endswith('*') else ''}: {count} "
        text += f"node{'s' if count != '1' else ''} {nodes} with {cpus} CPUs, {mem} MB, "
        text += f"{gpus} GPUs" if gpus else "no GPUs"
        if features not in ("(null)", ""):
            text += f", features {features}"
        out.append(text)
    return out or None


def sinfo(ctx: Context) -> list[tuple[str, bool, int, int]] | None:
    """(partition, is default, nodes, GPUs per node) per sinfo line, or None."""
    lines = _sinfo("%P|%D|%G", ctx.environ)
    if lines is None:
        return None
    rows = []
    for parts in lines:
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        name = parts[0]
        rows.append((name.rstrip("*"), name.endswith("*"), int(parts[1]), gres_gpus(parts[2])))
    return rows or None


def partition_capacity(ctx: Context) -> list[Finding]:
    spec = ctx.spec
    named = spec.slurm.partition or _args_partition(spec.slurm.sbatch_args)
    rows = sinfo(ctx)
    if rows is None:
        return []
    path = ("slurm", "partition") if spec.slurm.partition else ("slurm", "sbatch_args")
    if named is None:
        defaults = {r[0] for r in rows if r[1]}
        if len(defaults) != 1:
            return []
        named = defaults.pop()
    mine = [r for r in rows if r[0] == named]
    if not mine:
        known = ", ".join(sorted({r[0] for r in rows}))
        return [
            ctx.finding(
                "unknown-partition",
                WARNING,
                f"sinfo does not know partition {named!r} (partitions here: {known}): "
                "sbatch would refuse the job",
                "set slurm.partition to one of the partitions sinfo lists",
                *path,
            )
        ]
    total = sum(r[2] for r in mine)
    gpus = spec.gpus_per_node if spec.gpus_per_node > 0 else 0
    fit = sum(r[2] for r in mine if r[3] >= gpus)
    if spec.nodes <= fit:
        return []
    most = max(r[3] for r in mine)
    if gpus and most < gpus:
        have = f"at most {most} GPU(s)" if most else "no GPUs"
        what = f"gpus_per_node {gpus} but the nodes of partition {named!r} have {have}"
        fix = (
            f"ask for at most {most} GPUs per node, or pick a partition with bigger nodes"
            if most
            else "pick a partition with GPUs (slurm.partition), or set gpus_per_node: 0"
        )
        where: tuple[str, ...] = ("gpus_per_node",)
    elif fit < total:
        what = (
            f"nodes {spec.nodes} with {gpus} GPUs each, but partition {named!r} has only "
            f"{fit} node(s) with {gpus} or more GPUs ({total} in all)"
        )
        fix = f"ask for at most {fit} nodes, or fewer GPUs per node"
        where = ("nodes",)
    else:
        what = f"nodes {spec.nodes}, but partition {named!r} has only {total} node(s)"
        fix = f"ask for at most {total} nodes, or pick a bigger partition"
        where = ("nodes",)
    return [
        ctx.finding(
            "partition-too-small",
            ERROR,
            what + ": the job could never start (it would wait in the queue forever or be refused)",
            fix,
            *where,
        )
    ]


CHECKS = (node_local_treb_home, partition_capacity)
