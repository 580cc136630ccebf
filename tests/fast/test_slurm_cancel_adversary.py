"""Attacks on cancelling a Slurm run (docs/backends/slurm.md, "Following, logs, cancel"),
with stand-ins for sbatch, squeue and scancel that record what they were asked (no Slurm
in the fast suite; tests/integration/test_slurm_interrupt.py runs Ctrl+C on the cluster).

Why: Ctrl+C while `treb run --on slurm` submits (the run recorded, its job id not yet)
left the run PENDING with no job (LOST two minutes later, a failure that was a cancel),
and the terminal's SIGINT reached sbatch too: a job slurmctld had accepted before sbatch
died ran on with no run knowing its id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.conftest import TrebFn, write_spec

# sbatch as a terminal's Ctrl+C meets it: SIGINT to treb while the job is being accepted
SBATCH = """#!/bin/sh
kill -INT "$PPID"
sleep 0.5
echo 4242
"""
SCANCEL = '#!/bin/sh\necho "$*" >>"$CALLS/scancel"\n'
SQUEUE = "#!/bin/sh\necho '4242|CANCELLED|None|tn1'\n"


def test_ctrl_c_while_sbatch_runs_cancels_the_job_it_submitted(
    treb: TrebFn, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL), ("squeue", SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path)}
    spec = write_spec(tmp_path, "command: python3 train.py\nnodes: 1\nsnapshot: false\n")
    res = treb("run", str(spec), "--on", "slurm", env=env)
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    scancelled = (
        (tmp_path / "scancel").read_text().split() if (tmp_path / "scancel").exists() else []
    )
    assert scancelled == ["4242"], (scancelled, res.stderr)  # the job sbatch accepted
    runs = json.loads(treb("ps", "--json").stdout)
    assert [(r["state"], r["backend_id"]) for r in runs] == [("CANCELLED", "4242")], runs
    assert "4242" in res.stderr and "cancel" in res.stderr.lower(), res.stderr
    # the Ctrl+C is answered at once, though it waits for sbatch (up to its 120 s timeout)
    assert "interrupted: waiting for sbatch" in res.stderr, res.stderr
    assert res.stderr.index("waiting for sbatch") < res.stderr.index("Slurm job 4242"), res.stderr


def _controller(tmp_path: Path) -> Any:
    from trebuchet.runtime.slurm.step import Controller

    job = {"run_id": "r1", "run_dir": str(tmp_path), "workdir": str(tmp_path),
           "launcher": "native", "nodes": 1, "ppn": 1, "grace": 1,
           "checkpoint_signal": "SIGUSR2", "command": ["true"], "mpi_env": [],
           "max_attempts": 1, "srun": [], "srun_hook": [], "inline": False,
           "spec_env": [], "secrets": []}  # fmt: skip
    return Controller(job, str(tmp_path / "job.json"), str(tmp_path / "rt.pyz"))  # type: ignore[arg-type]


def test_an_array_tasks_controller_reads_its_own_state_not_the_arrays(
    tmp_path: Path, monkeypatch
) -> None:
    """The last task of a job array has the array's id as its SLURM_JOB_ID, and `squeue -j
    60` lists every task of the array (seen on the test cluster): its controller read
    another point's state as its own (a scancel of this point read as RUNNING: taken for
    treb cancel's signal, then `scancel 60` cancelled the sweep). It asks for `60_1`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = ('#!/bin/sh\ncase "$*" in *"-j 60_1 "*) echo "CANCELLED None" ;;\n'
              '*"-j 60 "*) printf "RUNNING None\\nCANCELLED None\\n" ;; esac\n')  # fmt: skip
    (bin_dir / "squeue").write_text(squeue)
    (bin_dir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "60")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "60")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert _controller(tmp_path).slurm_state()[0] == "CANCELLED None"


def test_a_cancelled_array_task_scancels_itself_not_its_array(tmp_path: Path, monkeypatch) -> None:
    """A cancelled run's controller scancels its own job so that Slurm says CANCELLED. In a
    job array (a sweep), SLURM_JOB_ID is the task's own id, which scancel refuses on
    Slurm 22.05 ('Invalid job id specified': the task then ended FAILED), and the last
    task's equals the array's id: `scancel 50` cancelled every point of the sweep. The
    task is named as the array's (`50_1`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(SCANCEL)
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path))
    for job_id, array, task, said in (("50", "50", "1", "50_1"), ("51", "50", "0", "50_0"),
                                      ("52", "", "", "52")):  # fmt: skip
        monkeypatch.setenv("SLURM_JOB_ID", job_id)
        monkeypatch.setenv("SLURM_ARRAY_JOB_ID", array)
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        _controller(tmp_path).cancel_own_job()
        assert (tmp_path / "scancel").read_text().split()[-1] == said


def test_an_array_tasks_requeue_requeues_that_task_alone(tmp_path: Path, monkeypatch) -> None:
    """`scontrol requeue 64` (the last task's own id, the array's) requeued every task of
    the array on the test cluster: each point of the sweep restarted when one asked for a
    new allocation (time limit, a trainer's requeue). It asks for `64_1`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "$*" >>"$CALLS/scontrol"\nexit 1\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "64")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "64")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    ctl = _controller(tmp_path)
    ctl.adir = str(tmp_path / "attempt-0")
    os.makedirs(ctl.adir)
    ctl.requeue()  # refused here (exit 1): returns, the attempt recorded TIMEOUT
    assert (tmp_path / "scontrol").read_text().split() == ["requeue", "64_1"]


def test_a_cancel_wait_that_is_no_number_is_named_before_anything_is_signalled(
    treb: TrebFn, treb_home: Path, tmp_path: Path
) -> None:
    """TREB_SLURM_CANCEL_WAIT_S=abc made `treb cancel` print a ValueError traceback after it
    had signalled the job (exit 1, the run left RUNNING); nan and inf never ended its wait.
    Now: exit 2 naming the variable, no scancel, the run as it was."""
    import time

    from trebuchet.store.db import RunRecord, Store

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    running = "#!/bin/sh\necho '4242|RUNNING|None|tn1'\n"
    for name, text in (("scancel", SCANCEL), ("squeue", running)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    run_dir = treb_home / "runs" / "cw1"
    (run_dir / "attempt-0").mkdir(parents=True)
    (run_dir / "job.json").write_text(json.dumps({"grace": 1}))
    (run_dir / "attempt-0" / "attempt.json").write_text(
        json.dumps({"attempt": 0, "state": "RUNNING"})
    )
    store = Store()
    store.insert_run(RunRecord(
        id="cw1", name="x", backend="slurm", launcher="native", state="RUNNING", nodes=1,
        procs_per_node=1, run_dir=str(run_dir), created_at=time.time(), backend_id="4242",
    ))  # fmt: skip
    store.close()
    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path)}
    for bad in ("abc", "nan", "inf", "-1", "1e999", "\x1b]0;x\x07"):
        res = treb("cancel", "cw1", env={**path, "TREB_SLURM_CANCEL_WAIT_S": bad}, timeout=60)
        assert res.returncode == 2, (bad, res.stderr)
        assert "TREB_SLURM_CANCEL_WAIT_S" in res.stderr and "Traceback" not in res.stderr, (
            res.stderr
        )
        assert "\x1b" not in res.stderr, res.stderr
    assert not (tmp_path / "scancel").exists()
    runs = json.loads(treb("ps", "--json", env=path).stdout)
    assert [r["state"] for r in runs] == ["RUNNING"], runs
