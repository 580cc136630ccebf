"""The line a node agent writes into a process's log when the process cannot start.

A launcher program (torchrun, mpirun, horovodrun) missing on a node gets its own line,
naming the program, the host, the node and the PATH that was searched: over ssh that is
the login shell's PATH (without ~/.bashrc's additions), under Slurm the job's, and the
fix depends on it (diagnose/catalog.py, `launcher_missing`, reads this line). Standard
library only: it runs on the nodes.
"""

from __future__ import annotations

import errno
import os
import socket

LAUNCHERS = ("torchrun", "mpirun", "horovodrun")  # diagnose/catalog.py's pattern names them


def line(argv0: str, exc: OSError, path: str | None, node: int) -> str:
    """What the log says about a process that could not start (`exc` from Popen)."""
    name = os.path.basename(argv0)
    if name in LAUNCHERS and exc.errno == errno.ENOENT:
        return (
            f"treb: {name} not found on {socket.gethostname()} (node {node}): not on its "
            f"PATH, which was {path if path is not None else '(unset: the system default)'}\n"
        )
    return f"treb: cannot start {argv0!r}: {exc.strerror}\n"
