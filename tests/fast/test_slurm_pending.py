"""Why a Slurm job is pending, in `treb ps`, `treb status` and --json, with a fake squeue.

Why: a job that asks for more than its partition has waits forever with no word from
trebuchet; squeue's reason code must reach the user in plain words, still with one squeue
call per refresh, and a partition's facts asked for once, not at every poll. The real
cluster's case is in tests/integration/test_slurm_pending.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fast.test_slurm_state import add_run, calls, fake_slurm  # noqa: F401 (fixture)
from trebuchet.backends.slurm.engine import SlurmBackend
from trebuchet.backends.slurm.reasons import explain
from trebuchet.store.db import Store

SCONTROL = """#!/bin/bash
echo "$*" >> "$FAKE_SLURM/scontrol.calls"
echo "PartitionName=$3 AllowGroups=ALL MaxNodes=UNLIMITED MaxTime=01:00:00 MinNodes=0 \
Nodes=tn[1-2] State=UP TotalCPUs=16 TotalNodes=2"
"""


@pytest.fixture
def scontrol(fake_slurm: Path) -> Path:  # noqa: F811 (the fixture imported above)
    path = fake_slurm / "fakebin" / "scontrol"
    path.write_text(SCONTROL)
    path.chmod(0o755)
    return fake_slurm


def scontrol_calls(fake: Path) -> list[str]:
    path = fake / "scontrol.calls"
    return path.read_text().splitlines() if path.exists() else []


def test_never_starting_job_is_explained_once(treb_home: Path, scontrol: Path) -> None:
    store = Store()
    add_run(store, treb_home, "toobig", "300", nodes=5, ppn=1)
    add_run(store, treb_home, "queued", "301")
    (scontrol / "squeue.out").write_text(
        "300|PENDING|PartitionNodeLimit||debug|UNLIMITED\n301|PENDING|Priority||debug|1:00:00\n"
    )
    backend = SlurmBackend()
    backend.refresh(store, store.list(active_only=True))
    big, queued = store.get("toobig"), store.get("queued")
    assert big.state == "PENDING" and big.waiting == {
        "reason": "PartitionNodeLimit", "starts": False, "source": "Slurm",
        "meaning": "will not start: partition debug has 2 nodes, the job asks for 5",
    }  # fmt: skip
    assert queued.waiting["starts"] is True and queued.waiting["reason"] == "Priority"
    assert len(calls(scontrol)) == 1 and "%r" in calls(scontrol)[0]
    assert scontrol_calls(scontrol) == ["show partition debug --oneliner"]
    # Later polls, even from another process, keep the explanation: no new scontrol call.
    time.sleep(1.1)  # past the squeue cache of one process
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert len(calls(scontrol)) == 2 and len(scontrol_calls(scontrol)) == 1
    assert store.get("toobig").waiting["starts"] is False
    # Once it runs, there is nothing to explain.
    (scontrol / "squeue.out").write_text("300|RUNNING|None|tn1|debug|UNLIMITED\n")
    time.sleep(1.1)
    backend.refresh(store, [store.get("toobig")])
    assert store.get("toobig").state == "RUNNING" and store.get("toobig").waiting is None


def treb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=60)  # fmt: skip


def test_ps_and_status_say_why(treb_home: Path, scontrol: Path) -> None:
    store = Store()
    add_run(store, treb_home, "toobig01", "300", nodes=5, ppn=1)
    add_run(store, treb_home, "queued01", "301")
    (scontrol / "squeue.out").write_text(
        "300|PENDING|PartitionNodeLimit||debug|UNLIMITED\n301|PENDING|Resources||debug|1:00:00\n"
    )
    store.close()
    ps = treb("ps")
    assert ps.returncode == 0, ps.stderr
    lines = ps.stdout.splitlines()
    assert any("toobig01" in ln and "PENDING (PartitionNodeLimit)" in ln for ln in lines), lines
    assert any("queued01" in ln and "PENDING (Resources)" in ln for ln in lines), lines
    assert ("toobig01: will not start: partition debug has 2 nodes, the job asks for 5 "
            "(Slurm: PartitionNodeLimit); `treb cancel toobig01` ends it") in lines  # fmt: skip
    assert not any(ln.startswith("queued01:") for ln in lines)  # it will start: no alarm
    status = treb("status", "toobig01")
    assert "will not start: partition debug has 2 nodes, the job asks for 5" in status.stdout
    queued = json.loads(treb("status", "queued01", "--json").stdout)
    assert queued["waiting"]["meaning"] == "waiting for free nodes"


@pytest.mark.parametrize(
    ("reason", "starts", "says"),
    [
        ("Priority", True, "higher priority"),
        ("Resources", True, "free nodes"),
        ("JobArrayTaskLimit", True, "at once"),
        ("QOSGrpNodeLimit", True, "at a limit"),
        ("ReqNodeNotAvail", True, "in use or reserved"),
        ("SomethingNew", True, "scontrol show job"),
        ("PartitionConfig", False, "per node"),
        ("PartitionTimeLimit", False, "asks for 2:00:00, more than partition debug allows (01:00"),
        ("PartitionDown", False, "partition debug is down"),
        ("BadConstraints", False, "constraints"),
        ("InvalidAccount", False, "slurm.account"),
        ("InvalidQOS", False, "slurm.qos"),
        ("JobHeldUser", False, "scontrol release"),
        ("DependencyNeverSatisfied", False, "never"),
        ("QOSMaxNodePerJobLimit", False, "one job may have"),
        ("AssocMaxWallDurationPerJobLimit", False, "one job may have"),
        ("ReqNodeNotAvail, UnavailableNodes:tn3", False, "down, drained or not responding: tn3"),
    ],
)
def test_reason_codes(reason: str, starts: bool, says: str) -> None:
    facts = {"TotalNodes": "8", "MaxNodes": "UNLIMITED", "MaxTime": "01:00:00"}
    got = explain(reason, "debug", 2, "2:00:00", facts)
    assert got is not None and got["starts"] is starts and says in got["meaning"], got
    assert got["meaning"].startswith("will not start: ") is not starts


def test_node_limits_and_no_reason() -> None:
    assert explain("None", "debug", 5) is None and explain("", "debug", 5) is None
    most = explain("PartitionNodeLimit", "big", 5, facts={"TotalNodes": "8", "MaxNodes": "4"})
    assert most["meaning"] == "will not start: partition big allows at most 4 nodes a job, " \
        "the job asks for 5"  # fmt: skip
    # Without the partition's facts (scontrol failed), still plain words, not a guess.
    blind = explain("PartitionNodeLimit", "big", 5)
    assert "asks for 5 nodes, outside partition big's limits" in blind["meaning"]
    # PartitionConfig is what Slurm says first of a job larger than its partition.
    config = explain("PartitionConfig", "debug", 5, facts={"TotalNodes": "2"})
    assert config["meaning"] == "will not start: partition debug has 2 nodes, the job asks for 5"
