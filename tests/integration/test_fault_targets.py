"""Issue 33 (low): `treb fault RUN kill-node N` names the host that node N is now: after a
spare replaced node 1, node 1 is the spare (node-2), and the fault event records it.
Real local runs on simulated nodes; outcomes only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_first_failure import wait_for
from tests.integration.test_recovery_local import events

pytestmark = pytest.mark.integration
PY = sys.executable

# Every attempt's ranks say they are up, then wait to be killed.
WAIT = """\
import os, time
run = os.environ['TREB_RUN_DIR']
open(os.path.join(run, f"ready-{os.environ['TREB_ATTEMPT']}-{os.environ['RANK']}"), 'w').close()
time.sleep(300)
"""


def test_kill_node_after_a_spare_names_the_node_it_is_now(treb, tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text(WAIT)
    spec = write_spec(tmp_path, f"command: [{PY}, w.py]\nnodes: 2\nspare_nodes: 1\n"
                                "retries: 1\ngrace_period: 1s\n")  # fmt: skip
    assert treb("run", str(spec), "--detach").returncode == 0
    st = status_json(treb)
    run, run_dir = st["id"], Path(st["run_dir"])
    ready = lambda a: all((run_dir / f"ready-{a}-{r}").exists() for r in (0, 1))  # noqa: E731
    wait_for(lambda: ready(0), "attempt 0 never started")
    assert treb("fault", run, "kill-node", "1").returncode == 0
    wait_for(lambda: ready(1), "attempt 1 never started")
    res = treb("fault", run, "kill-node", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: status_json(treb, run)["state"] == "FAILED", "the run did not end")
    faults = [(e["attempt"], e["node"], e["host"]) for e in events(run_dir)
              if e["event"] == "fault"]  # fmt: skip
    assert faults == [(0, 1, "node-1"), (1, 1, "node-2")], faults
    lost = [(e["attempt"], e["host"]) for e in events(run_dir) if e["event"] == "node_lost"]
    assert lost == [(0, "node-1"), (1, "node-2")], lost
