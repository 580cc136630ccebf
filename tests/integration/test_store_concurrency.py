"""The run store under load: 8 concurrent `treb run` plus `treb ps` loops in other processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec

pytestmark = pytest.mark.integration
TREB = [sys.executable, "-m", "trebuchet"]


def test_eight_concurrent_runs_and_ps_loops(treb_home: Path, tmp_path: Path) -> None:
    # Retries make each run write several attempts; the odd ones fail once, then succeed.
    cmd = (
        'echo "rank $RANK attempt $TREB_ATTEMPT"; sleep 0.3; test "$TREB_ATTEMPT" -ge "${FAILS:-0}"'
    )
    spec = write_spec(tmp_path, f"command: '{cmd}'\nprocs_per_node: 2\nretries: 1\n")
    env = dict(os.environ)
    runs = []
    for i in range(8):
        args = [*TREB, "run", str(spec), "--name", f"load-{i}", "-o", f"env.FAILS={i % 2}"]
        runs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    ps_results: list[subprocess.CompletedProcess] = []
    try:
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in runs) and time.monotonic() < deadline:
            ps_results.append(subprocess.run([*TREB, "ps", "--json"], env=env, capture_output=True))
            ps_results.append(subprocess.run([*TREB, "ps"], env=env, capture_output=True))
        outs = [p.communicate(timeout=60) for p in runs]
    finally:
        for p in runs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_out, err) in zip(runs, outs, strict=False):
        assert p.returncode == 0, err.decode()[-2000:]
        assert b"locked" not in err
    assert len(ps_results) >= 2
    for res in ps_results:
        assert res.returncode == 0 and b"locked" not in res.stderr, res.stderr.decode()
    for res in ps_results[::2]:
        json.loads(res.stdout)  # always a whole, valid answer
    final = json.loads(subprocess.run([*TREB, "ps", "--json"], env=env, capture_output=True).stdout)
    assert sorted(r["name"] for r in final) == [f"load-{i}" for i in range(8)]
    assert all(r["state"] == "SUCCEEDED" for r in final)
    assert sorted(r["attempt"] for r in final) == [0] * 4 + [1] * 4
