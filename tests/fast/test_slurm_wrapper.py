"""The per-task wrapper of the Slurm runtime, run for real in bash, outside Slurm.

Why: with proctrack/linuxproc Slurm signals a step's processes one by one, children first,
so a rank's command can die of SIGTERM before its wrapper's own SIGTERM arrives. That rank
must still be recorded as stopped (by a cancel, a time limit or the first-failure
teardown), or a cancelled job would name it as the root cause. The ordering cannot be
forced on the test cluster, so here the command kills itself with SIGTERM and the wrapper
never gets one; the `squeue` on PATH is a stand-in that prints the job state Slurm shows
while it ends a job (said where it is used).
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from trebuchet.backends import slurm_runtime as rt
from trebuchet.launcher.bash_helpers import HELPERS

SELF_TERM = "kill -TERM $$"  # the command dies of SIGTERM; the wrapper gets no signal


def run_wrapper(
    tmp_path: Path, command: str, squeue_state: str | None = None, rc: int = 143
) -> dict:
    """One native task through the wrapper; its outcome record."""
    run_dir = tmp_path / "run"
    (run_dir / "attempt-0").mkdir(parents=True, exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # scancel: the teardown after a genuine failure calls it; record instead of signalling.
    tools = {"scancel": 'echo "$*" >> "$FAKE_CALLS"\n'}
    if squeue_state is not None:  # stand-in: the job's state while Slurm ends it
        tools["squeue"] = f'echo "$*" >> "$FAKE_CALLS"\necho {squeue_state}\n'
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_CALLS": str(tmp_path / "calls"),
        "TREB_RUN_DIR": str(run_dir), "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0",
        "TREB_LAUNCHER": "native", "TREB_PPN": "1", "TREB_GRACE": "2",
        "TREB_CHECKPOINT_SIGNAL": "SIGUSR1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1", "OMP_NUM_THREADS": "1",
    }  # fmt: skip
    script = HELPERS + rt.TASK
    res = subprocess.run(
        ["bash", "-c", script, "treb-task", "task", "bash", "-c", command],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == rc, (res.stdout, res.stderr)
    return json.loads((run_dir / "attempt-0" / "rank-0.json").read_text())


def calls(tmp_path: Path) -> str:
    path = tmp_path / "calls"
    return path.read_text() if path.exists() else ""


def test_command_killed_by_a_treb_cancel_is_recorded_as_stopped(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cancel-requested").write_text("1\n")
    rec = run_wrapper(tmp_path, SELF_TERM)
    assert rec["signal"] == "SIGTERM" and rec["stopped_by_launcher"] is True
    assert "scancel" not in calls(tmp_path) and calls(tmp_path) == ""  # no teardown, no squeue


def test_command_killed_in_a_teardown_is_recorded_as_stopped(tmp_path: Path) -> None:
    (tmp_path / "run" / "attempt-0").mkdir(parents=True)
    (tmp_path / "run" / "attempt-0" / "teardown").write_text("0:1\n")  # another rank failed
    rec = run_wrapper(tmp_path, SELF_TERM)
    assert rec["stopped_by_launcher"] is True and calls(tmp_path) == ""


@pytest.mark.parametrize("state", ["CANCELLED", "COMPLETING", "TIMEOUT"])
def test_command_killed_while_slurm_ends_the_job_is_recorded_as_stopped(
    tmp_path: Path, state: str
) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM, squeue_state=state)
    assert rec["stopped_by_launcher"] is True
    assert calls(tmp_path).splitlines() == ["-h -j 77 -o %T"]  # one squeue, no teardown


def test_command_killed_while_the_job_runs_is_the_first_failure(tmp_path: Path) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM, squeue_state="RUNNING")
    assert rec["stopped_by_launcher"] is False and rec["exit_code"] == 143
    # It stops the rest of the step, and says so to the wrappers that lose the race.
    assert calls(tmp_path).splitlines() == ["-h -j 77 -o %T", "--signal=TERM 77.0"]
    assert (tmp_path / "run" / "attempt-0" / "teardown").read_text().strip() == "0:0"


def test_without_squeue_a_signal_death_is_a_failure(tmp_path: Path) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM)
    assert rec["stopped_by_launcher"] is False and rec["signal"] == "SIGTERM"


def test_a_crash_is_never_a_cascade(tmp_path: Path) -> None:
    """Only stop signals (HUP, INT, KILL, TERM) can come from a cancel: a segfault cannot."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cancel-requested").write_text("1\n")
    rec = run_wrapper(tmp_path, "kill -SEGV $$", squeue_state="CANCELLED", rc=139)
    assert rec["signal"] == "SIGSEGV" and rec["stopped_by_launcher"] is False
    assert calls(tmp_path).splitlines() == ["--signal=TERM 77.0"]  # no squeue; teardown
