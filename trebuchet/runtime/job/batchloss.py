"""Slurm's batch host lost: the node that runs the job controller died, so nothing there
can notice it, and with `--no-kill` (spare nodes, a node range) Slurm keeps the job
RUNNING on the other nodes without its batch script. The agents on those nodes notice
instead: the controller stopped answering their heartbeats (agent_link) for the spec's
node_timeout. The first of them to get here records the lost node (runtime/job/nodeloss.py,
as the controller records any other), then requeues the job when an attempt is left (its
restart, on nodes Slurm still has, runs the next attempt from the checkpoint), or ends it
FAILED with that cause.

A network partition between an agent and the controller looks the same from the agent:
then the controller ends its attempt without that node, and the requeue restarts the job;
the run goes on either way. Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from ..rundir.records import append_event, now, write_json
from . import link as agent_link
from . import nodeloss, selfrequeue

if TYPE_CHECKING:
    from ..contracts.schema import JobFile, Result

MARK = "controller-lost"  # in the attempt's folder: the agent that acts made it


def controller_host() -> str:
    """The controller's host, as its agents' line names it."""
    target = agent_link.parse(os.environ.get(agent_link.ENV, ""))
    return target[0] if target else "?"


def on_lost(job: JobFile, attempt: int, timeout: float, last_heard: float) -> None:
    """The batch host is lost (see the module): recorded once, then requeue or the end."""
    adir = os.path.join(job["run_dir"], f"attempt-{attempt}")
    try:
        os.close(os.open(os.path.join(adir, MARK), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:
        return  # another agent acts (or the folder is gone: the job is ending)
    host = controller_host()
    seen = time.strftime("%H:%M:%S", time.localtime(last_heard))
    left = attempt + 1 < int(job["max_attempts"])
    then = "the job is requeued" if left else "no attempt is left"
    message = (f"{nodeloss.LABEL}: {host} (the job controller's node: no answer for "
               f"{timeout:g}s, last heard {seen}); {then}")  # fmt: skip
    nodes = step_hosts()
    node = nodes.index(host) if host in nodes else 0
    nodeloss.record(job["run_dir"], attempt, node, host, message, last_heard)
    scontrol = real_scontrol(job["run_dir"])
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if left:
        append_event(job["run_dir"], "job_requeue", attempt=attempt, who="agent",
                     why=message)  # fmt: skip
        subprocess.run([scontrol, "requeue", job_id], capture_output=True, timeout=60)
        return
    end: Result = {"state": "FAILED", "reason": message, "source": "batch", "attempt": attempt,
                   "exit_code": 1, "ended_at": now(), "job_id": job_id}  # fmt: skip
    write_json(os.path.join(job["run_dir"], "result.json"), end)
    subprocess.run(["scancel", job_id], capture_output=True, timeout=60)


def step_hosts() -> list[str]:
    """This step's nodes, in order (their NODE_RANK)."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return out.split()


def real_scontrol(run_dir: str) -> str:
    """Slurm's scontrol, not the ranks' shim (selfrequeue.py) first on the step's PATH."""
    shim = os.path.join(run_dir, selfrequeue.SHIM_DIR)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != shim)
    return shutil.which("scontrol", path=path) or "scontrol"
