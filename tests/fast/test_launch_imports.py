"""The import budget of a launch: what `treb run SPEC` of a spec it has run before (the spec
cache, supervised in the same process) has imported when its first rank starts.

Why pinned: every module imported before the first start is paid by every launch (the
launch figures of docs/performance.md), and the figure slipped once already, module by
module, without a single change that looked heavy. The modules are read from sys.modules
in the real `treb` process (an audit hook, no timing), so the test holds on a loaded
machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MARK = "treb-first-rank"  # the rank's last argument, for the hook to know its start

PROBE = """
import json, os, sys

out, mark, seen = sys.argv[1], sys.argv[2], {}

def hook(event, args):
    if event == "os.mkdir" and os.path.basename(str(args[0])).startswith("treb-") \\
            and "mkdir" not in seen:  # the run's cgroup: its move begins next (begin)
        seen["mkdir"] = sorted(sys.modules)
    if event == "subprocess.Popen" and "rank" not in seen and mark in [str(a) for a in args[1]]:
        seen["rank"] = sorted(sys.modules)
        with open(out, "w") as fh:
            json.dump(seen, fh)

sys.addaudithook(hook)
from trebuchet.cli.main import main
code = main(sys.argv[3:])
sys.stdout.flush()
os._exit(code)
"""

# Imported only by the runs that need them (or never by a launch): none of them before the
# first rank of a plain local run starts.
NOT_BEFORE_THE_FIRST_RANK = (
    "pydantic", "yaml", "rich", "torch",  # the spec models, the terminal's extras
    "ctypes",  # the subreaper's prctl goes through _ctypes (runtime/process/procs.py)
    "hashlib",  # OpenSSL: the spec cache digests with _blake2
    "concurrent.futures",  # health checks on several nodes at once
    "urllib.request", "http.client", "ssl",  # trackers, webhooks
    "importlib.metadata",  # engines from entry points: `--on` another engine, --version
    "difflib",  # did-you-mean, on a mistyped option
    "trebuchet.runtime.node.horovodrun",  # socket and struct, for horovod's launches
    "trebuchet.runtime.publish.webhooks",  # notify: only
    # what watches a running rank (its lines' parsers, GPUs, stacks): the agent makes them
    # once its ranks started (Agent._watch, issue 36)
    "trebuchet.runtime.watch.metric_reader", "trebuchet.runtime.watch.eta",
    "trebuchet.runtime.watch.stacks",
)  # fmt: skip

# The Supervisor's own modules (launcher/local_nodes.py: the agent, its readers, the job
# controller) are imported once the cgroup move has begun: during its wait, not before it.
AFTER_THE_CGROUP_MOVE_BEGINS = (
    "trebuchet.launcher.local_nodes",
    "trebuchet.runtime.node.agent",
    "trebuchet.runtime.job.life",
)

# trebuchet's own modules imported before the first rank starts: 106 when this budget was
# set (the Supervisor's ~30 among them, imported during the cgroup move's wait). A module
# more is a cost every launch pays: raise it only knowingly.
TREBUCHET_MODULES_BUDGET = 106


def _cgroup_possible() -> bool:
    from trebuchet.runtime.process import contain

    return any(os.access(os.path.join(b, "cgroup.procs"), os.W_OK) for b in contain.candidates())


def test_a_cached_launch_imports_only_what_its_first_rank_needs(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        f"command: [{json.dumps(sys.executable)}, -c, pass, {MARK}]\nprocs_per_node: 2\n"
    )
    env = {**os.environ, "TREB_HOME": str(tmp_path / "home")}
    env.pop("TREB_SPEC_CACHE", None)
    out = tmp_path / "modules.json"
    argv = [sys.executable, "-c", PROBE, str(out), MARK, "run", "job.yaml"]
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr  # validated, cached, run (an exec: no probe)
    out.unlink(missing_ok=True)
    second = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "SUCCEEDED" in second.stderr
    seen = json.loads(out.read_text())  # the first rank started in this process: cached
    at_start = set(seen["rank"])
    assert [m for m in NOT_BEFORE_THE_FIRST_RANK if m in at_start] == []
    ours = sorted(m for m in at_start if m.split(".")[0] == "trebuchet")
    assert len(ours) <= TREBUCHET_MODULES_BUDGET, ours
    if "mkdir" not in seen:
        assert not _cgroup_possible(), "the run made no cgroup where one could be made"
        pytest.skip("no writable cgroup v2 here: the move's overlap is not tried")
    at_move = set(seen["mkdir"])
    assert [m for m in AFTER_THE_CGROUP_MOVE_BEGINS if m in at_move] == []
    assert all(m in at_start for m in AFTER_THE_CGROUP_MOVE_BEGINS)  # imported, later
