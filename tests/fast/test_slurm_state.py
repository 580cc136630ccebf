"""Slurm run states from the job's records plus one squeue call, with a fake squeue.

Why: following must cost one squeue call per poll whatever the number of runs (slurmctld
RPC limits), must name the root-cause rank and node, and must never leave a vanished job
RUNNING forever; none of that needs a cluster to check.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trebuchet.backends.slurm import state as st
from trebuchet.backends.slurm.engine import SlurmBackend
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.states import first_failure

FAKE_SQUEUE = """#!/bin/bash
echo "$*" >> "$FAKE_SLURM/squeue.calls"
cat "$FAKE_SLURM/squeue.out" 2>/dev/null
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A squeue that logs its calls and prints $FAKE_SLURM/squeue.out; no sacct."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(FAKE_SQUEUE)
    squeue.chmod(squeue.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_SLURM", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path


def calls(fake: Path) -> list[str]:
    path = fake / "squeue.calls"
    return path.read_text().splitlines() if path.exists() else []


def add_run(store: Store, home: Path, rid: str, job: str, nodes: int = 2, ppn: int = 2) -> Path:
    run_dir = home / "runs" / rid
    run_dir.mkdir(parents=True)
    store.insert_run(RunRecord(
        id=rid, name="x", backend="slurm", launcher="native", state="RUNNING", nodes=nodes,
        procs_per_node=ppn, run_dir=str(run_dir), created_at=time.time(), backend_id=job,
    ))  # fmt: skip
    return run_dir


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def rank(r: int, code: int, ended: float, stopped: bool = False, host: str = "tn1") -> dict:
    return {"label": f"{r // 2}:{r % 2}", "rank": r, "node": r // 2, "local_rank": r % 2,
            "host": host, "pid": 100 + r, "state": "ENDED", "exit_code": code,
            "signal": "SIGTERM" if code == 143 else None, "started_at": 1.0,
            "ended_at": ended, "stopped_by_launcher": stopped, "attempt": 0}  # fmt: skip


def test_one_squeue_call_for_twenty_runs(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    for i in range(20):
        add_run(store, treb_home, f"run{i:02d}", str(100 + i))
    (fake_slurm / "squeue.out").write_text(
        "".join(f"{100 + i}|{'RUNNING' if i % 2 else 'PENDING'}|None|tn1\n" for i in range(20))
    )
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert len(calls(fake_slurm)) == 1
    assert "--jobs=" + ",".join(str(100 + i) for i in range(20)) in calls(fake_slurm)[0]
    states = {r.id: r.state for r in store.list()}
    assert states["run01"] == "RUNNING" and states["run00"] == "PENDING"


def test_vanished_job_without_records_is_lost(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    add_run(store, treb_home, "gone", "77")
    (fake_slurm / "squeue.out").write_text("")
    SlurmBackend().refresh(store, store.list(active_only=True))
    rec = store.get("gone")
    assert rec.state == "LOST"
    assert "left the queue without an outcome record" in store.attempts("gone")[0]["reason"]


def test_vanished_job_whose_run_dir_was_deleted_is_lost_without_a_crash(
    treb_home: Path, fake_slurm: Path
) -> None:
    """`treb ps` must answer when a user deleted a run directory by hand (seen in CI)."""
    import shutil

    store = Store()
    shutil.rmtree(add_run(store, treb_home, "nodir", "76"))
    (fake_slurm / "squeue.out").write_text("")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("nodir").state == "LOST"


def test_squeue_failure_concludes_nothing(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    add_run(store, treb_home, "keep", "78")
    (fake_slurm / "fakebin" / "squeue").write_text("#!/bin/bash\necho down >&2\nexit 1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("keep").state == "RUNNING"


def test_failed_run_names_root_cause_rank_and_node(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    run_dir = add_run(store, treb_home, "fail", "79")
    adir = run_dir / "attempt-0"
    write(
        adir / "attempt.json",
        {
            "attempt": 0,
            "state": "FAILED",
            "started_at": 1.0,
            "ended_at": 9.0,
            "reason": "srun exited with code 3",
        },
    )
    # rank 1 exits 1 first, but it was stopped by the teardown; rank 3 (node 1) is the cause
    write(adir / "rank-0.json", rank(0, 143, 5.0, stopped=True))
    write(adir / "rank-1.json", rank(1, 1, 2.0, stopped=True))
    write(adir / "rank-2.json", rank(2, 1, 4.0, host="tn2"))
    write(adir / "rank-3.json", rank(3, 3, 3.0, host="tn2"))
    write(run_dir / "result.json", {"state": "FAILED", "source": "batch", "exit_code": 3})
    (fake_slurm / "squeue.out").write_text("79|FAILED|NonZeroExitCode|tn[1-2]\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    rec = store.get("fail")
    assert rec.state == "FAILED" and rec.exit_code == 3
    ff = rec.first_failure
    assert (ff["rank"], ff["node"], ff["host"], ff["attempt"]) == (3, 1, "tn2", 0)
    procs = store.procs("fail")
    assert len(procs) == 4 and sum(p["stopped_by_launcher"] for p in procs) == 2
    assert store.attempts("fail")[0]["reason"] == "srun exited with code 3"


def test_completing_job_ends_when_its_controller_decided(treb_home, fake_slurm) -> None:
    """The job controller's result (source batch) ends the run while Slurm still winds the
    job down (a lost node keeps it COMPLETING until SlurmdTimeout); without one, the run
    stays RUNNING until Slurm is done."""
    store = Store()
    add_run(store, treb_home, "open", "79")
    run_dir = add_run(store, treb_home, "comp", "80")
    write(run_dir / "result.json", {"state": "SUCCEEDED", "source": "batch"})
    (fake_slurm / "squeue.out").write_text("79|COMPLETING|None|tn1\n80|COMPLETING|None|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("comp").state == "SUCCEEDED"
    assert store.get("open").state == "RUNNING"


def test_requeued_job_is_retrying(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    run_dir = add_run(store, treb_home, "rq", "81")
    write(run_dir / "attempt-0" / "attempt.json", {"attempt": 0, "state": "TIMEOUT"})
    (fake_slurm / "squeue.out").write_text("81|PENDING|BeginTime|\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    rec = store.get("rq")
    assert rec.state == "RETRYING" and store.attempts("rq")[0]["state"] == "TIMEOUT"


@pytest.mark.parametrize(
    "result,squeue,expected",
    [
        ({"state": "SUCCEEDED", "source": "batch"}, None, ("SUCCEEDED", None)),
        ({"state": "CANCELLED", "source": "signal", "reason": "r"}, "PREEMPTED",
         ("FAILED", "preempted")),
        ({"state": "CANCELLED", "source": "signal", "reason": "r"}, "CANCELLED",
         ("CANCELLED", "r")),
        ({"state": "TIMEOUT", "source": "batch", "reason": "t"}, "COMPLETED", ("TIMEOUT", "t")),
        (None, "TIMEOUT", ("TIMEOUT", None)),
        (None, "NODE_FAIL", ("FAILED", None)),
        (None, "OUT_OF_MEMORY", ("FAILED", None)),
        (None, None, ("LOST", None)),
    ],
)  # fmt: skip
def test_final_state_mapping(result, squeue, expected) -> None:
    files = st.JobFiles(result=result)
    info = st.QueueInfo(squeue) if squeue else None
    state, reason = st.final_state(files, info, "5")
    assert state == expected[0]
    if expected[1]:
        assert reason == expected[1]


def test_parse_squeue_and_states() -> None:
    jobs = st.parse_squeue("5|RUNNING|None|tn[1-2]\n6|PENDING|Priority|\n7_1|COMPLETED|None|tn1\n")
    assert jobs["5"].state == "RUNNING" and jobs["5"].nodes == "tn[1-2]"
    assert jobs["6"].reason == "Priority" and "7_1" in jobs
    files = st.JobFiles()
    assert st.live_state(jobs["6"], files) == "PENDING"
    assert st.live_state(st.QueueInfo("COMPLETING"), files) == "RUNNING"
    assert st.live_state(jobs["7_1"], files) is None
    # the job controller decided (its result.json) while Slurm still winds the job down
    decided = st.JobFiles(result={"state": "FAILED", "source": "batch"})
    assert st.live_state(st.QueueInfo("COMPLETING"), decided) is None
    guessed = st.JobFiles(result={"state": "CANCELLED", "source": "signal"})
    assert st.live_state(st.QueueInfo("COMPLETING"), guessed) == "RUNNING"


def test_a_lost_node_is_the_root_cause_before_its_peers_failures() -> None:
    from trebuchet.runtime.rundir.records import first_failure

    peer = {"label": "rank 0", "rank": 0, "node": 0, "exit_code": 1, "ended_at": 5.0}
    lost = {"label": "node_lost", "rank": None, "node": 1, "exit_code": 1, "ended_at": 9.0,
            "message": "node_lost: tn2 (no heartbeat for 10s, last seen 12:00:00)"}  # fmt: skip
    assert first_failure([peer, lost]) == lost


def test_first_failure_prefers_ranks_over_node_agents() -> None:
    agent = {"label": "1", "rank": None, "node": 1, "exit_code": 1, "ended_at": 1.0}
    worker = {"label": "1:0", "rank": 2, "node": 1, "exit_code": 7, "ended_at": 2.0}
    assert first_failure([agent, worker]) == worker
    assert first_failure([agent]) == agent
    assert first_failure([{**worker, "exit_code": 0}]) is None


def test_ps_with_slurm_runs_stays_light(treb_home: Path, fake_slurm: Path) -> None:
    """`treb ps` refreshes slurm runs without importing pydantic or rich (speed rule)."""
    store = Store()
    add_run(store, treb_home, "light", "90")
    (fake_slurm / "squeue.out").write_text("90|RUNNING|None|tn1\n")
    probe = (
        "import sys\nfrom trebuchet.cli.main import main\nmain(['ps'])\n"
        "print(sorted(m for m in ('pydantic', 'rich', 'torch') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ}, check=True)  # fmt: skip
    assert res.stdout.strip().splitlines()[-1] == "[]"
    assert "RUNNING" in res.stdout and len(calls(fake_slurm)) == 1


def test_cancel_before_sbatch_needs_no_slurm(treb_home: Path, fake_slurm: Path) -> None:
    store = Store()
    add_run(store, treb_home, "nojob", "")
    store.update_run("nojob", backend_id=None)
    SlurmBackend().cancel(store, store.get("nojob"))
    assert store.get("nojob").state == "CANCELLED" and calls(fake_slurm) == []


def test_a_requeue_seen_as_failed_for_a_moment_is_not_the_end(treb_home, fake_slurm) -> None:
    """slurmctld can show a requeued job as FAILED between its end and PENDING (seen on the
    test cluster with `scontrol requeue`): the job's own guess stands until it settles."""
    store = Store()
    run_dir = add_run(store, treb_home, "pre", "82", nodes=1, ppn=1)
    trap = {"state": "CANCELLED", "reason": "stopped by Slurm (COMPLETING None)",
            "source": "signal", "attempt": 0, "ended_at": time.time()}  # fmt: skip
    write(run_dir / "result.json", trap)
    write(run_dir / "attempt-0" / "attempt.json", {"attempt": 0, "state": "CANCELLED"})
    (fake_slurm / "squeue.out").write_text("82|FAILED|NonZeroExitCode|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("pre").state == "RUNNING"  # not concluded yet
    (fake_slurm / "squeue.out").write_text("82|PENDING|BeginTime|\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("pre").state == "RETRYING"


def test_a_contradicted_guess_ends_the_run_once_settled(treb_home, fake_slurm) -> None:
    store = Store()
    run_dir = add_run(store, treb_home, "pmt", "83", nodes=1, ppn=1)
    old = time.time() - st.REQUEUE_SETTLE_S - 1
    write(run_dir / "result.json", {"state": "CANCELLED", "source": "signal", "ended_at": old})
    (fake_slurm / "squeue.out").write_text("83|PREEMPTED|None|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("pmt").state == "FAILED"


def test_treb_cancel_ends_at_once(treb_home, fake_slurm) -> None:
    store = Store()
    run_dir = add_run(store, treb_home, "cxl", "84", nodes=1, ppn=1)
    (run_dir / "cancel-requested").write_text("1\n")
    now = time.time()
    write(run_dir / "result.json", {"state": "CANCELLED", "source": "signal", "ended_at": now})
    (fake_slurm / "squeue.out").write_text("84|FAILED|NonZeroExitCode|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("cxl").state == "CANCELLED"


def test_a_rank_killed_before_it_could_record_its_end_is_stopped(treb_home, fake_slurm) -> None:
    """Slurm's (or mpirun's) SIGKILL can end a rank's wrapper before it writes its end; once
    the attempt is over, such a rank was stopped, with no exit code to show (seen in CI with
    mpirun and `treb cancel`)."""
    store = Store()
    run_dir = add_run(store, treb_home, "mk", "85")
    adir = run_dir / "attempt-0"
    write(adir / "attempt.json", {"attempt": 0, "state": "CANCELLED", "source": "signal"})
    write(adir / "rank-0.json", rank(0, 143, 2.0, stopped=True))
    write(adir / "rank-1.json", {**rank(1, 0, 0.0), "state": "RUNNING", "exit_code": None})
    (run_dir / "cancel-requested").write_text("1\n")
    write(run_dir / "result.json", {"state": "CANCELLED", "source": "signal", "ended_at": 2.0})
    (fake_slurm / "squeue.out").write_text("85|CANCELLED|None|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert store.get("mk").state == "CANCELLED" and store.get("mk").first_failure is None
    procs = {p["rank"]: p for p in store.procs("mk")}
    assert procs[1]["stopped_by_launcher"] and procs[1]["exit_code"] is None
    assert procs[0]["stopped_by_launcher"] and procs[0]["exit_code"] == 143


def test_a_cancel_the_controller_never_answers_closes_the_attempt_too(
    treb_home: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`treb cancel` whose job controller never ends the run (hung, SIGSTOPped: seen on the
    test cluster): after TREB_SLURM_CANCEL_WAIT_S + 2 x grace a plain scancel, and the run
    CANCELLED with its running attempt, not a CANCELLED run whose attempt 0 stays RUNNING
    in `treb status` for ever (the run is no longer refreshed once ended)."""
    scancel = fake_slurm / "fakebin" / "scancel"
    scancel.write_text('#!/bin/bash\necho "$*" >> "$FAKE_SLURM/scancel.calls"\n')
    scancel.chmod(0o755)
    monkeypatch.setenv("TREB_SLURM_CANCEL_WAIT_S", "0.2")
    store = Store()
    run_dir = add_run(store, treb_home, "hung", "86", nodes=1, ppn=1)
    write(run_dir / "job.json", {"grace": 0.1})
    write(run_dir / "attempt-0" / "attempt.json",
          {"attempt": 0, "state": "RUNNING", "started_at": time.time()})  # fmt: skip
    (fake_slurm / "squeue.out").write_text("86|RUNNING|None|tn1\n")
    SlurmBackend().refresh(store, store.list(active_only=True))
    assert [a["state"] for a in store.attempts("hung")] == ["RUNNING"]
    SlurmBackend().cancel(store, store.get("hung"))
    said = (fake_slurm / "scancel.calls").read_text().splitlines()
    assert said == ["--signal=TERM --batch 86", "86"], said
    assert store.get("hung").state == "CANCELLED"
    assert [a["state"] for a in store.attempts("hung")] == ["CANCELLED"], store.attempts("hung")
