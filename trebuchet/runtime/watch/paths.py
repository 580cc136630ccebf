"""The per-rank paths a rank is handed at its start (TREB_MARKS, TREB_STACKS_FILE), and the
metrics' cap a run's end reads, apart from the modules that read those files: the node agent
computes them before its first rank starts, and imports the readers (their regexes, parsers)
only once its ranks run (issue 36: 64 agents' start on one machine).

Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

import os

MARKS_DIR = "marks"  # attempt-<n>/marks/<name>: trebuchet.dist.mark's (watch/marks.py)
STACKS_DIR = "stacks"  # attempt-<n>/stacks: dumps and faulthandler files (watch/stacks.py)
METRICS_CONFIG = "metrics.json"  # in the run directory, written at submission (metric_reader)
MAX_NAMES = 256  # distinct metric names a process writes, and a run keeps (docs/metrics.md)


def marks_path(adir: str, name: str) -> str:
    return os.path.join(adir, MARKS_DIR, name)


def metrics_config(adir: str) -> str:
    """The run's metrics.json (its metrics, progress and GPU watch) of an attempt's folder."""
    return os.path.join(os.path.dirname(adir.rstrip("/")), METRICS_CONFIG)


def stacks_dir(adir: str) -> str:
    return os.path.join(adir, STACKS_DIR)


def faulthandler_path(adir: str, name: str) -> str:
    return os.path.join(stacks_dir(adir), name + ".faulthandler")


COUNTED = "c"  # a metrics point's key: its step is a count of points, no step the rank gave
