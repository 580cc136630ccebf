"""The runtime's command line (`python3 treb-runtime-<version>-<hash>.pyz VERB ...`):

controller JOB_JSON       a Slurm job's batch step (attempts, retries, requeue)
task JOB_JSON             one task of the ranks' srun step (a node's agent; a rank under
                          native with slurm.mpi); parked, it runs the next attempts too
hook pre|post JOB_JSON    the spec's pre/post command on one node
worker [--slurm] [--grace S] [--mpi PPN] -- CMD...
                          one rank started by torchrun, mpirun or horovodrun
signal SIGNAME JOB_JSON   on one node of a Slurm job: the checkpoint signal to the ranks
                          there that handle it (the controller's step at the warning)
fault ACTION ARGS...      `treb fault` on this node: kill-node, hang-rank, preempt
health DIR TOKEN          `treb check --nodes N`: this node's health checks
node JOB_JSON             one node of SkyPilot or Kubernetes (the engine sets NODE_RANK,
                          NUM_NODES, MASTER_ADDR, MASTER_PORT, TREB_RUN_ID, TREB_RUN_DIR)
horovod-wait ADIR S RANK...  over ssh, a node whose ranks node 0's horovodrun starts: lasts
                          as long as they run (runtime/node/horovodrun.py)
"""

from __future__ import annotations

import json
import os
import sys

from .rundir.regular import read_text

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from .contracts.schema import JobFile


def _job(path: str) -> JobFile:
    try:  # a regular file only: the run directory is the ranks' too (a FIFO never blocks)
        job: JobFile = json.loads(read_text(path))  # the job file: a JSON object
        return job
    except (OSError, ValueError, RecursionError) as exc:
        sys.stderr.write(f"treb: cannot read the job file {path}: {exc}\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    verb = args.pop(0) if args else ""
    from .node import task

    if verb == "worker":
        return task.worker(args)
    if verb == "task" and len(args) == 1:
        return task.slurm_task(_job(args[0]))
    if verb == "signal" and len(args) == 2:
        return task.deliver(_job(args[1]), args[0])
    if verb == "node" and len(args) == 1:
        from .node.per_node import node

        return node(_job(args[0]))
    if verb == "horovod-wait" and len(args) >= 2:
        from .node.horovodrun import wait

        return wait(args)
    if verb == "hook" and len(args) == 2 and args[0] in ("pre", "post"):
        return task.slurm_hook(_job(args[1]), args[0])
    if verb == "health":  # `treb check --nodes N` on this node (runtime/node/health.py)
        from .node.health import on_demand

        return on_demand(args)
    if verb == "fault":  # `treb fault` on this node (runtime/node/fault.py)
        from .node.fault import main as fault

        return fault(args)
    if verb == "controller" and len(args) == 1:
        from .node.per_node import setup_environ
        from .slurm.step import Controller

        setup_environ()  # the environment the job's script made, whatever started python3

        runtime = task.self_argv()[-1]
        return Controller(_job(args[0]), os.path.abspath(args[0]), runtime).run()
    sys.stderr.write(__doc__ or "")
    return 2
