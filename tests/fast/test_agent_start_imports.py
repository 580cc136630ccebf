"""The import budget of a Slurm node agent's start: what the shipped archive's `task` verb
has imported when it asks for its first rank's start.

Why pinned: each of a step's agents pays every module it imports before its ranks start,
and at 64 nodes on one machine the 64 agents' start was ~1 s of a launch's +2.96 s over
srun (issue 36, docs/scale.md); a node death's restart pays it again. The watchers of a
running rank (metrics, ETA, GPUs, marks, stacks), the lost controller's path and typing
itself were imported there once, module by module. Read from sys.modules by an audit hook
in the real agent process (no timing), run as srun runs it: `python3 -S <archive> task
job.json`, with a controller link (a real Hub) that gives the barrier's go.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trebuchet.launcher.runtime_file import ship
from trebuchet.runtime.job.link import Hub

MARK = "treb-first-rank"
PROBE = """
import os, sys
archive, job, mark, out = sys.argv[1:5]

def hook(event, args):
    if event == "subprocess.Popen" and mark in [str(a) for a in args[1]]:
        with open(out, "w") as fh:
            fh.write("\\n".join(sorted(sys.modules)))
        os._exit(0)

sys.addaudithook(hook)
sys.argv = [archive, "task", job]
sys.path.insert(0, archive)
import runpy
runpy._run_module_as_main("__main__", False)  # as python3 runs a zip
"""

# Imported once the node's ranks run, or only on a path that is not the start's: none of
# them before the first rank starts.
NOT_BEFORE_THE_FIRST_RANK = (
    "typing",  # annotations only: TYPE_CHECKING = False in the agent's modules
    "treb_runtime.watch.eta", "treb_runtime.watch.metric_reader", "treb_runtime.watch.gpu",
    "treb_runtime.watch.marks", "treb_runtime.watch.stacks",  # Agent._watch, after the start
    "treb_runtime.watch.display_lines",  # the log reader's splitter, at its first read
    "treb_runtime.job.batchloss", "treb_runtime.job.selfrequeue",  # a lost controller's
    "shutil", "shlex", "bz2", "lzma",  # ... which selfrequeue and stacks import
    "treb_runtime.job.nodeloss", "treb_runtime.job.nodeset",  # an unhealthy node's
    "treb_runtime.job.life", "treb_runtime.node.per_node",  # the controller's; a parked end
    "treb_runtime.slurm.step", "treb_runtime.publish.webhooks",
    "treb_runtime.contracts.schema",  # the records' types: the type checker's
    "ctypes",  # the subreaper's prctl goes through _ctypes alone (process/procs.py)
    "encodings.idna", "unicodedata",  # a str host's getaddrinfo: ASCII names go as bytes
)  # fmt: skip

# The runtime's own modules imported before the first rank starts: 22 when this budget was
# set (30 before issue 36's cut). A module more is paid by every agent of every step.
RUNTIME_MODULES_BUDGET = 22


def test_a_slurm_node_agent_imports_only_what_its_first_rank_needs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "attempt-0").mkdir(parents=True)
    (run / "attempt-0" / "attempt.json").write_text(json.dumps({"job_id": "77", "attempt": 0}))
    archive = ship(run)
    job = run / "job.json"
    job.write_text(json.dumps({
        "run_id": "r1", "run_dir": str(run), "workdir": str(tmp_path), "launcher": "native",
        "nodes": 2, "ppn": 2, "grace": 2, "checkpoint_signal": "SIGUSR1", "mpi_env": [],
        "command": ["/bin/true", MARK], "srun": ["--ntasks-per-node=1"],
    }))  # fmt: skip
    rfd, wfd = os.pipe()
    hub = Hub(wfd)
    try:
        hub.expect(0, 1)  # this agent alone: its `health` gets the go (a 2-node barrier)
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TREB_RUN_DIR": str(run),
            "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0", "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500", "TREB_AGENT_PARK": "1",
            "TREB_CONTROLLER_LINK": hub.address("127.0.0.1"),
        }  # fmt: skip
        out = tmp_path / "modules.txt"
        argv = [sys.executable, "-S", "-c", PROBE, str(archive), str(job), MARK, str(out)]
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    finally:
        hub.close()
        os.close(rfd)
        os.close(wfd)
    assert res.returncode == 0 and out.exists(), res.stderr  # it reached its first rank
    at_start = set(out.read_text().split("\n"))
    assert "treb_runtime.node.agent" in at_start  # the probe saw the agent's own start
    assert [m for m in NOT_BEFORE_THE_FIRST_RANK if m in at_start] == []
    ours = sorted(m for m in at_start if m.split(".")[0] == "treb_runtime")
    assert len(ours) <= RUNTIME_MODULES_BUDGET, ours
