"""Fault injection on a node (`treb fault`, docs/recovery.md): the runtime's `fault` verb,
run on the node where the fault happens (Slurm: an `srun --overlap -w NODE` step of the
job; ssh: a command on the host; locally: in `treb` itself).

- kill-node: SIGKILL, at once and without a word to anyone, to every process of the run
  on this node (its node agent, its ranks and what they started): what a node that died
  leaves behind. A process is the run's when its environment carries TREB_RUN_ID (or,
  on Slurm, SLURM_JOB_ID: the batch step's controller); `node` narrows it to NODE_RANK
  (simulated nodes that share a machine). Only processes in this process's own UTS and
  network namespaces count (a test cluster's nodes share one PID space), on Slurm only
  those whose SLURMD_NODENAME is this node's, and never the machine's daemons (slurmd,
  slurmstepd, sshd): a real dead node's die too, but here they would report the deaths.
- hang-rank: SIGSTOP to a rank and what it started (from its record of the latest attempt):
  it neither progresses nor dies, as a rank stuck in a collective.
- preempt (ssh, local): SIGTERM to every running rank of the latest attempt, from
  outside, as a scheduler that takes its resources back.

Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from ..job.retry_codes import PREEMPTED  # in the attempt's folder: when a preemption began
from ..process import procs
from ..rundir.records import read_json, write_json

KILL_NODE, HANG_RANK, PREEMPT = "kill-node", "hang-rank", "preempt"
DAEMONS = ("slurmd", "slurmstepd", "sshd")  # the machine's, not the run's: a dead node's
# daemons die with it, but killing them here would tell the controller (slurmstepd reports)


def _namespaces(pid: str) -> tuple[str, str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/uts"), os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return "", ""


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def node_processes(run_id: str, node: int | None = None, job_id: str = "") -> list[int]:
    """The run's live processes on this node (see the module's docstring), not this one
    and not its ancestors (the step or session that started it)."""
    me = os.getpid()
    skip = {me, *procs.ancestors(me)}
    here = _namespaces("self")
    run = f"TREB_RUN_ID={run_id}".encode()
    job = f"SLURM_JOB_ID={job_id}".encode() if job_id else None
    rank = f"NODE_RANK={node}".encode() if node is not None else None
    here_name = os.environ.get("SLURMD_NODENAME")  # Slurm: this node's processes only
    named = f"SLURMD_NODENAME={here_name}".encode() if job and here_name else None
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip or _comm(name) in DAEMONS:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if not (run in env or (job is not None and job in env)):
            continue
        if (rank is not None and rank not in env) or (named is not None and named not in env):
            continue
        if _namespaces(name) == here:
            found.append(int(name))
    return found


def kill_node(run_id: str, node: int | None = None, job_id: str = "") -> list[int]:
    """SIGKILL to every process of the run on this node (stopped first, so that none
    reacts to a peer's death or starts another before its own SIGKILL)."""
    pids = node_processes(run_id, node, job_id)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            procs.signal_pid(pid, sig)
    return pids


def latest_attempt(run_dir: str) -> str | None:
    names = [n for n in os.listdir(run_dir) if n.startswith("attempt-") and n[8:].isdigit()]
    if not names:
        return None
    return os.path.join(run_dir, max(names, key=lambda n: int(n[8:])))


def attempt_file(run_dir: str, name: str) -> dict[str, Any]:
    """`name` in the run's latest attempt folder; {} when absent or no JSON object (a rank
    can write there: anything else is no record)."""
    adir = latest_attempt(run_dir)
    data = read_json(os.path.join(adir, name)) if adir else None
    return data if isinstance(data, dict) else {}


def running_ranks(run_dir: str, run_id: str) -> dict[int, int]:
    """{rank: pid} of the latest attempt's running ranks on this machine."""
    adir = latest_attempt(run_dir)
    out: dict[int, int] = {}
    for name in sorted(os.listdir(adir)) if adir else []:
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        rec = read_json(os.path.join(str(adir), name))
        if not isinstance(rec, dict) or rec.get("state") != "RUNNING":
            continue
        pid, rank = rec.get("pid"), rec.get("rank")
        if isinstance(pid, int) and isinstance(rank, int) and procs.in_run(pid, run_id):
            out[rank] = pid
    return out


def hang_rank(run_dir: str, run_id: str, rank: int) -> int | None:
    """SIGSTOP to the rank's process and what it started (not its agent, which shares its
    process group and must go on beating); its pid, or None when it does not run here."""
    pid = running_ranks(run_dir, run_id).get(rank)
    if pid is None:
        return None
    for p in [pid, *procs.descendants(pid)]:
        procs.signal_pid(p, signal.SIGSTOP)
    return pid


def preempt(run_dir: str, run_id: str) -> list[int]:
    """SIGTERM to every running rank here (the agent then applies the grace period), the
    preemption on record in the attempt's folder first: a rank it ends is no program's
    exit, and `retries` alone decide (retry_codes.cause_code reads it)."""
    pids = list(running_ranks(run_dir, run_id).values())
    adir = latest_attempt(run_dir)
    if pids and adir is not None:
        path = os.path.join(adir, PREEMPTED)
        if read_json(path) is None:  # the first preemption's time (a second one is later)
            write_json(path, {"time": time.time(), "by": "treb fault"})
    for pid in pids:
        procs.signal_pid(pid, signal.SIGTERM)
    return pids


def main(args: list[str]) -> int:
    """`fault kill-node RUN_ID [NODE_RANK] [--job J] | hang-rank RUN_DIR RUN_ID RANK |
    preempt RUN_DIR RUN_ID`: the pids signalled, one line; exit 1 when none."""
    job = ""
    if "--job" in args:
        i = args.index("--job")
        job = args[i + 1] if i + 1 < len(args) else ""
        del args[i : i + 2]
    host = os.uname().nodename
    if args[:1] == [KILL_NODE] and len(args) in (2, 3):
        node = int(args[2]) if len(args) == 3 else None
        pids = kill_node(args[1], node, job)
        print(f"[treb] {host}: SIGKILL to {len(pids)} process(es) {pids}", flush=True)
        return 0 if pids else 1
    if args[:1] == [HANG_RANK] and len(args) == 4 and args[3].isdigit():
        pid = hang_rank(args[1], args[2], int(args[3]))
        said = f"SIGSTOP to rank {args[3]} (pid {pid})" if pid else f"rank {args[3]} not here"
        print(f"[treb] {host}: {said}", flush=True)
        return 0 if pid else 1
    if args[:1] == [PREEMPT] and len(args) == 3:
        pids = preempt(args[1], args[2])
        print(f"[treb] {host}: SIGTERM to {len(pids)} rank(s) {pids}", flush=True)
        return 0 if pids else 1
    sys.stderr.write(main.__doc__ or "")
    return 2
