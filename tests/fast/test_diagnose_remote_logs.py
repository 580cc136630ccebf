"""A run whose records stayed on its nodes (SkyPilot, Kubernetes: only the ranks' logs
come back, backends/node_logs.py) is diagnosed from those logs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRACEBACK = """\
all_reduce 10 of 4
Traceback (most recent call last):
  File "/treb-code/ranks.py", line 18, in <module>
    raise ValueError("rank 3 fails on purpose")
ValueError: rank 3 fails on purpose
"""


def test_the_ranks_logs_alone_name_the_cause(tmp_path: Path) -> None:
    adir = tmp_path / "run" / "attempt-0"
    adir.mkdir(parents=True)
    for rank in range(3):
        (adir / f"rank-{rank}.log").write_text("all_reduce 10 of 4\n")
    (adir / "rank-3.log").write_text(TRACEBACK)
    (adir / "agent-node-1.log").write_text("treb: rank 3 (1:1) failed (exit code 1)\n")
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "cause:    python_exception on rank 3" in res.stdout, res.stdout + res.stderr
    assert "ValueError: rank 3 fails on purpose" in res.stdout
