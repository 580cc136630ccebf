"""Trainers that requeue their own Slurm job (Lightning's auto-requeue, submitit), made to
cooperate with the job controller, which requeues too and counts attempts: two requeues,
or one it did not make, left the attempts wrong.

So only the controller requeues: the ranks find a `scontrol` shim first on their PATH that
turns `scontrol requeue <this job>` into a request the controller reads, and runs the real
scontrol for anything else.
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
    """The shim first on PATH (the steps and ranks inherit it); the real scontrol's path."""
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
    """Who asked for a requeue since the last look ('rank 0 on tn1'), taking the request."""
    path = os.path.join(run_dir, REQUEST)
    if not os.path.exists(path):
        return None
    who = ""
    with contextlib.suppress(OSError):  # a regular file only: a rank's FIFO never blocks
        who = "".join(c for c in read_text(path, 800)[:200] if c.isprintable()).strip()
    with contextlib.suppress(OSError):  # taken even when unreadable: asked once, not forever
        os.unlink(path)
    return who or "a rank"
