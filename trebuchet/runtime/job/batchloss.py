"""Slurm's batch host lost: nothing on it can notice, and with `--no-kill` Slurm keeps the
job RUNNING on the other nodes without its batch script. So the agents there notice (no
answer from the controller for node_timeout): the first records the lost node, then
requeues the job when an attempt is left, or ends it FAILED with that cause.

A network partition looks the same from an agent: the controller then ends its attempt
without that node and the requeue restarts the job; the run goes on either way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import TYPE_CHECKING

from ..contracts.rank_env import expand_hostlist
from ..rundir.records import append_event, now, write_json
from . import link as agent_link
from . import nodeloss, selfrequeue

if TYPE_CHECKING:
    from ..contracts.schema import JobFile, Result

MARK = "controller-lost"  # in the attempt's folder: the agent that acts made it


def controller_host() -> str:
    target = agent_link.parse(os.environ.get(agent_link.ENV, ""))
    return target[0] if target else "?"


def on_lost(job: JobFile, attempt: int, timeout: float, last_heard: float) -> None:
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
        _act(job["run_dir"], attempt, [scontrol, "requeue", job_id])
        return
    end: Result = {"state": "FAILED", "reason": message, "source": "batch", "attempt": attempt,
                   "exit_code": 1, "ended_at": now(), "job_id": job_id}  # fmt: skip
    write_json(os.path.join(job["run_dir"], "result.json"), end)
    _act(job["run_dir"], attempt, ["scancel", job_id])


def _act(run_dir: str, attempt: int, argv: list[str]) -> None:
    """Run Slurm's command; one missing or hung past its minute must not end the link's
    thread with a traceback: the loss is recorded already, the failure to act is said."""
    try:
        subprocess.run(argv, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        append_event(run_dir, "agent_error", attempt=attempt, who="agent",
                     why=f"could not run {argv[0]} {argv[1]}: {e}")  # fmt: skip


def step_hosts() -> list[str]:
    """This step's nodes, in order (their NODE_RANK); none where the nodelist cannot be read
    (python-hostlist's BadHostlist, the small parser's ValueError): it only places the lost
    node, and on_lost, past its mark, must still requeue or end the job."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        return expand_hostlist(nodelist) if nodelist else []
    except Exception:  # noqa: BLE001  # BadHostlist is python-hostlist's own Exception
        return []


def real_scontrol(run_dir: str) -> str:
    """Not the ranks' shim (selfrequeue.py), first on the step's PATH."""
    shim = os.path.join(run_dir, selfrequeue.SHIM_DIR)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != shim)
    return shutil.which("scontrol", path=path) or "scontrol"
