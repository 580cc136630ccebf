"""What the end-to-end `treb run` of a silent program imports (issue 34's 2-rank launch
figure: every module is paid by every launch, and a 2-rank launch is ~0.12 s in all).

The watchers of a rank's lines (metrics, ETA, stacks), the results' parsers and the failure
report's code map are imported when there is something for them: a line printed, a failure.
A silent run never imports them; a run that prints one metrics line and exits at once
imports them and records the metric (the watchers start at the first line, and see it).
Read from `python -X importtime`'s own report (CPython's documented format) of a `treb run`
served from the spec cache (supervised in its own process), no timing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import TrebFn, write_spec

LAZY = (
    "trebuchet.runtime.watch.eta", "trebuchet.runtime.watch.stacks",
    "trebuchet.runtime.watch.metric_reader", "trebuchet.results.parse",
    "trebuchet.diagnose.codepaths",
)  # fmt: skip


def imported(tmp_path: Path, program: str) -> tuple[set[str], subprocess.CompletedProcess]:
    (tmp_path / "prog.py").write_text(program)
    spec = write_spec(tmp_path, "name: quiet\nprocs_per_node: 2\ncommand: python prog.py\n")
    for flags in ([], ["-X", "importtime"]):  # the second from the spec cache: in-process
        res = subprocess.run([sys.executable, *flags, "-m", "trebuchet", "run", str(spec)],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ))  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
    names = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", res.stderr, re.M))
    assert "trebuchet.launcher.local_nodes" in names, res.stderr[-2000:]  # supervised here
    return names, res


def test_a_silent_run_never_imports_what_reads_lines(treb: TrebFn, tmp_path: Path) -> None:
    names, _ = imported(tmp_path, "pass\n")
    assert not names & set(LAZY), sorted(names & set(LAZY))


def test_a_run_that_prints_and_ends_at_once_has_its_metric(treb: TrebFn, tmp_path: Path) -> None:
    names, _ = imported(tmp_path, "print({'step': 1, 'loss': 0.25}, flush=True)\n")
    assert {"trebuchet.runtime.watch.eta", "trebuchet.runtime.watch.metric_reader"} <= names
    res = treb("metrics", "--json")
    assert res.returncode == 0, res.stderr
    assert "loss" in json.dumps(json.loads(res.stdout)), res.stdout
