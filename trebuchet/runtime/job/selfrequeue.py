"""Trainers that requeue their own Slurm job, made to cooperate with the job controller.

Lightning's SLURM auto-requeue (and submitit-style handlers) catch a signal before the time
limit, save a checkpoint and run `scontrol requeue $SLURM_JOB_ID` from rank 0. The job
controller requeues the job too (controller.on_warning), and counts attempts: two requeues,
or one the controller did not make, left the attempts wrong (a requeued job whose restart
found no attempt left, a run ended FAILED).

So exactly one of them requeues, the controller: the ranks find a `scontrol` first on their
PATH (`<run dir>/bin/scontrol`, written here) that turns `scontrol requeue <this job>` into
a request the controller reads (`<run dir>/requeue-request`: who asked), and runs the real
scontrol for anything else. The controller then requeues the job as its own requeue (an
attempt counted, the retries obeyed: with none left it says so and does not requeue).

Stdlib only (runs in the Slurm batch step).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil

from ..rundir.records import write_text
from ..rundir.regular import read_text

REQUEST = "requeue-request"
SHIM_DIR = "bin"


def shim(run_dir: str, real: str | None) -> str:
    """The `scontrol` the ranks find first: a requeue of this job becomes a request."""
    request = shlex.quote(os.path.join(run_dir, REQUEST))
    run = f"exec {shlex.quote(real)} \"$@\"" if real else (
        'echo "treb: scontrol not found on $(hostname)" >&2; exit 127')  # fmt: skip
    return f"""#!/bin/sh
# trebuchet: `scontrol requeue <this job>` from a rank (Lightning's SLURM auto-requeue,
# submitit) asks trebuchet's job controller, which requeues the job once and counts the
# attempt; every other scontrol command is the real one.
if [ "$1" = requeue ] && [ "$#" = 2 ]; then
  case "$2" in
    "$SLURM_JOB_ID"|"${{SLURM_ARRAY_JOB_ID:-none}}_${{SLURM_ARRAY_TASK_ID:-none}}")
      f={request}
      printf 'rank %s on %s\\n' "${{RANK:-?}}" "$(hostname)" > "$f.$$" && mv -f "$f.$$" "$f" &&
        {{ echo "treb: requeue of job $2 handed to trebuchet's job controller" >&2; exit 0; }}
      ;;
  esac
fi
{run}
"""


def install(run_dir: str) -> str:
    """Write the shim, put its folder first on this process's PATH (the steps and ranks
    inherit it) and forget an old request; the real scontrol's path for the controller's
    own calls ('scontrol' when not found)."""
    real = shutil.which("scontrol")
    folder = os.path.join(run_dir, SHIM_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    write_text(os.path.join(folder, "scontrol"), shim(run_dir, real), mode=0o700)
    path = os.environ.get("PATH", "")
    if not path.startswith(folder + os.pathsep):
        os.environ["PATH"] = folder + os.pathsep + path
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(run_dir, REQUEST))
    return real or "scontrol"


def asked(run_dir: str) -> str | None:
    """Who asked for a requeue since the last look ('rank 0 on tn1'), taking the request;
    None when nobody did."""
    path = os.path.join(run_dir, REQUEST)
    if not os.path.exists(path):
        return None
    who = ""
    with contextlib.suppress(OSError):  # a regular file only: a rank's FIFO never blocks
        who = "".join(c for c in read_text(path, 800)[:200] if c.isprintable()).strip()
    with contextlib.suppress(OSError):  # taken even when unreadable: asked once, not forever
        os.unlink(path)
    return who or "a rank"
