"""Diagnosis gaps a new user met (issue 13, item 5), read from captured real logs and from
run directories laid out as trebuchet writes them: a failed environment build, a job sbatch
refused, a time limit reached by a silent program, the `treb logs` hint filled in, crash
advice fitted to a run without GPUs, and a Slurm job that left the queue without an outcome.

The same failures are produced for real in tests/integration/test_diagnose_runs.py and
test_diagnose_slurm.py; these fast tests pin the wording and the edge cases."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from trebuchet.diagnose import catalog
from trebuchet.diagnose.report import diagnose_paths, diagnose_run, two_lines

CAPTURED = Path(__file__).resolve().parent.parent / "fixtures" / "diagnose" / "captured"


@pytest.fixture
def no_sinfo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine without Slurm's commands: the refusal's fix cannot list partitions."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_environment_build_package_not_found_uv(tmp_path: Path) -> None:
    run_dir = shutil.copytree(CAPTURED / "env_not_found_run", tmp_path / "c00a6230")
    d = diagnose_paths([run_dir])
    assert d.category == "environment_build"
    assert "treb-no-such-package-xyz was not found in the package index" in d.summary
    assert any("uv pip install" in e for e in d.evidence)  # the command that failed
    assert any("not found in the package registry" in e for e in d.evidence)
    assert d.log and d.log.endswith("environment.log")
    assert "environment.requirements" in d.remedy and "`treb logs" not in d.remedy


def test_environment_build_names_its_command_whatever_the_installer_printed_after(
    tmp_path: Path,
) -> None:
    """The failed command (`$ uv pip install ...`) was looked for in the log's last five
    lines only: uv's hints and warnings after its error pushed it out (the integration test
    of this failure lost it once under load)."""
    run_dir = shutil.copytree(CAPTURED / "env_not_found_run", tmp_path / "c00a6230")
    with open(run_dir / "environment.log", "a") as fh:
        fh.write("\n      hint: Packages were unavailable because the network was slow\n"
                 "      hint: Pre-releases are available for none of the requirements\n"
                 "warning: Failed to read the cache entry: retrying\n"
                 "warning: Failed to read the cache entry: retrying\n"
                 "warning: Failed to read the cache entry: retrying\n")  # fmt: skip
    d = diagnose_paths([run_dir])
    assert d.category == "environment_build", d
    assert any("uv pip install" in e for e in d.evidence), d.evidence


def test_environment_build_package_not_found_pip(tmp_path: Path) -> None:
    d = diagnose_paths([CAPTURED / "pip_not_found.log"])
    assert d.category == "environment_build"
    assert "satisfies the requirement treb-no-such-package-xyz" in d.summary


def test_environment_build_other_failure_keeps_its_message(tmp_path: Path) -> None:
    # a setup step that fails: not a missing package, still the environment's category
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "environment.log").write_text("$ bash setup.sh\nsetup.sh: line 3: make: "
                                             "command not found\n")  # fmt: skip
    err = f"setup failed (exit 127); see {run_dir}/environment.log"
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "environment_failed",
                                                      "error": err}) + "\n")  # fmt: skip
    d = diagnose_paths([run_dir])
    assert d.category == "environment_build"
    assert "setup failed (exit 127)" in d.summary
    assert any("make: command not found" in e for e in d.evidence)


def test_sbatch_refusal_names_what_was_asked(tmp_path: Path, no_sinfo: None) -> None:
    run_dir = shutil.copytree(CAPTURED / "sbatch_refused_run", tmp_path / "4005c2d5")
    d = diagnose_paths([run_dir])
    assert d.category == "scheduler_refusal", d.summary
    assert d.summary == "sbatch refused the job: Requested node configuration is not available"
    assert any("--mem=900G" in e for e in d.evidence)
    assert "sinfo" in d.remedy and "slurm.mem" in d.remedy  # no sinfo here: how to look


def test_sbatch_refusal_fix_lists_the_partitions(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sinfo").write_text("#!/bin/sh\necho 'debug*|2|tn[1-2]|8|21695|(null)|(null)'\n"
                                "echo 'gpu|4|g[1-4]|64|512000|gpu:a100:8|a100'\n")  # fmt: skip
    (fake / "sinfo").chmod(0o755)
    run = {"id": "4005c2d5", "run_dir": str(shutil.copytree(CAPTURED / "sbatch_refused_run",
           tmp_path / "4005c2d5")), "state": "FAILED", "backend": "slurm", "attempt": 0,
           "reason": "sbatch refused the job: sbatch: error: Batch job submission failed: "
           "Requested node configuration is not available"}  # fmt: skip
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{fake}:{old}"
    try:
        d = diagnose_run(run)
    finally:
        os.environ["PATH"] = old
    assert d.category == "scheduler_refusal"
    assert "debug (default): 2 nodes tn[1-2] with 8 CPUs, 21695 MB, no GPUs" in d.remedy
    assert "gpu: 4 nodes g[1-4] with 64 CPUs, 512000 MB, 8 GPUs, features a100" in d.remedy
    assert catalog.SINFO_HINT not in d.remedy


def test_srun_refusal_in_a_console_log() -> None:
    d = diagnose_paths([CAPTURED / "srun_refused.log"])
    assert d.category == "scheduler_refusal"
    assert "Memory specification can not be satisfied" in d.summary
    assert any("Requested node configuration is not available" in e for e in d.evidence)


def test_a_step_slurm_stopped_without_saying_why() -> None:
    # Slurm's real output (stop 44's CI): the time limit ended the step, srun printed its
    # abort and both tasks' SIGTERM, and slurmstepd's DUE TO TIME LIMIT line was lost.
    d = diagnose_paths([CAPTURED / "slurm-2.out"])
    assert d.category == "stopped_by_slurm", d.summary
    assert (d.rank, d.node) == (None, None)
    assert "none failed on its own" in d.summary
    assert "`sacct -j 2 -o JobID,State,Reason,Elapsed,Timelimit`" in d.summary
    assert "sacct -j 2 " in d.remedy and "JOBID" not in d.remedy
    assert d.evidence[0].startswith("srun: Job step aborted")
    assert {d.roles[id(u)] for u in d.units} == {"stopped"}


def test_a_stopped_step_with_a_failed_task_is_that_task(tmp_path: Path) -> None:
    # the same log, one task having exited 1 before the abort: that task is the failure
    text = (CAPTURED / "slurm-2.out").read_text()
    log = tmp_path / "slurm-7.out"
    log.write_text(text.replace("tn2: task 1: Terminated", "tn2: task 1: Exited with exit code 1"))
    d = diagnose_paths([log])
    assert d.category == "unknown" and d.rank == 1, d.summary


def _timeout_run(tmp_path: Path, silent_s: float, ran_s: float, printed: bool = True) -> dict:
    """A TIMEOUT run directory of 2 ranks whose logs were last written `silent_s` before
    the attempt's end (their mtimes are set as the kernel would have left them)."""
    run_dir = tmp_path / "run"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    end = time.time() - 5
    start = end - ran_s
    for r in (0, 1):
        log = adir / f"rank-{r}.log"
        log.write_text(f"epoch 3 step {100 + r}\n" if printed else "")
        os.utime(log, (end - silent_s - r, end - silent_s - r))
        (adir / f"rank-{r}.json").write_text(json.dumps({
            "rank": r, "node": 0, "local_rank": r, "exit_code": 140, "signal": "SIGUSR2",
            "started_at": start, "ended_at": end, "stopped_by_launcher": True}))  # fmt: skip
    (run_dir / "job.json").write_text(json.dumps({"timeout": ran_s, "launcher": "native"}))
    return {"id": "ab12", "run_dir": str(run_dir), "state": "TIMEOUT", "attempt": 0,
            "backend": "local", "ended_at": end}  # fmt: skip


def test_time_limit_after_a_long_silence_is_likely_hung(tmp_path: Path) -> None:
    d = diagnose_run(_timeout_run(tmp_path, silent_s=1500, ran_s=3600))
    assert d.category == "time_limit"
    assert "no rank had written anything for the last 25m00s" in d.summary
    assert "likely hung" in d.summary
    assert any("last output: rank 0" in e and "epoch 3 step 100" in e for e in d.evidence)
    assert d.remedy == catalog.TIME_LIMIT_SILENT


def test_time_limit_of_a_program_that_never_printed(tmp_path: Path) -> None:
    d = diagnose_run(_timeout_run(tmp_path, silent_s=3590, ran_s=3600, printed=False))
    assert "likely hung" in d.summary and any("no output at all" in e for e in d.evidence)


def test_time_limit_of_a_program_that_kept_printing_is_not_hung(tmp_path: Path) -> None:
    d = diagnose_run(_timeout_run(tmp_path, silent_s=2, ran_s=3600))
    assert d.category == "time_limit" and "hung" not in d.summary
    assert d.remedy == catalog.REMEDIES["time_limit"]
    assert any(e.startswith("last output: rank 0") for e in d.evidence)  # the facts still


def _segfault_run(tmp_path: Path, ngpus: str) -> dict:
    run_dir = tmp_path / f"run-{ngpus}"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    (adir / "rank-0.log").write_text("loading\n")
    (adir / "rank-0.json").write_text(json.dumps({"rank": 0, "node": 0, "exit_code": 139,
                                                  "signal": "SIGSEGV", "ended_at": 1.0}))  # fmt: skip
    job = {"launcher": "native", "plan": {"procs": [{"env": {"TREB_NGPUS": ngpus}}]}}
    (run_dir / "job.json").write_text(json.dumps(job))
    ff = {"rank": 0, "node": 0, "exit_code": 139, "signal": "SIGSEGV", "attempt": 0}
    return {"id": "cd34", "run_dir": str(run_dir), "state": "FAILED", "attempt": 0,
            "first_failure": ff, "backend": "local"}  # fmt: skip


def test_segfault_advice_fits_a_run_without_gpus(tmp_path: Path) -> None:
    cpu = diagnose_run(_segfault_run(tmp_path, "0"))
    assert cpu.category == "segfault" and cpu.remedy == catalog.SEGFAULT_CPU
    assert "CUDA" not in cpu.remedy and "NCCL" not in cpu.remedy
    gpu = diagnose_run(_segfault_run(tmp_path, "8"))
    assert gpu.category == "segfault" and gpu.remedy == catalog.REMEDIES["segfault"]


def test_logs_hint_names_the_run_and_rank(tmp_path: Path) -> None:
    run = _segfault_run(tmp_path, "0")
    (Path(run["run_dir"]) / "attempt-0" / "rank-0.log").write_text(
        "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n"
        "ValueError: bad\n")  # fmt: skip
    run["first_failure"] = {"rank": 0, "node": 0, "exit_code": 1, "attempt": 0}
    (Path(run["run_dir"]) / "attempt-0" / "rank-0.json").write_text(
        json.dumps({"rank": 0, "node": 0, "exit_code": 1}))  # fmt: skip
    d = diagnose_run({**run, "attempt": 0})
    assert d.category == "python_exception"
    assert "(`treb logs cd34 --rank 0` has its whole output)" in d.remedy
    assert "RUN" not in d.remedy and "--rank R" not in d.remedy
    later = diagnose_run({**run, "attempt": 2, "first_failure": {**run["first_failure"]}})
    assert "`treb logs cd34 --rank 0 --attempt 1`" in later.remedy  # not the latest attempt
    assert "`treb logs cd34 --rank 0`" in two_lines(d)[1]


def test_logs_hint_for_logs_from_elsewhere(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-3.log").write_text("Traceback (most recent call last):\n"
                                     "  File \"t.py\", line 1, in <module>\nValueError: x\n")  # fmt: skip
    (logs / "rank-0.log").write_text("ok\n")
    d = diagnose_paths([logs])
    assert f"({logs / 'rank-3.log'} has its whole output)" in d.remedy
    console = tmp_path / "console.log"
    console.write_text("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"t.py\", "
                       "line 1, in <module>\n[rank1]: ValueError: x\n[rank0]: hi\n")  # fmt: skip
    d = diagnose_paths([console])
    assert f"{console} has its whole output, in the lines of rank 1" in d.remedy
    unknown = tmp_path / "job.out"
    unknown.write_text("srun: error: tn1: task 0: Exited with exit code 3\n")
    d = diagnose_paths([unknown])
    assert d.category == "unknown" and f"({unknown} has its whole output)" in d.remedy


def test_slurm_job_that_left_the_queue_without_an_outcome(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    reason = ("job 4242 left the queue without an outcome record: is TREB_HOME on a "
              "filesystem the nodes share, and did the job start at all? (see batch.log)")  # fmt: skip
    run = {"id": "ef56", "run_dir": str(run_dir), "state": "LOST", "attempt": 0,
           "backend": "slurm", "backend_id": "4242", "host": "login1", "reason": reason}  # fmt: skip
    d = diagnose_run(run)
    assert d.category == "node_failure"
    assert d.summary.startswith("Slurm job 4242 left the queue without an outcome record")
    assert "supervisor" not in d.summary and "host went down" not in d.summary
    assert f"attempt 1: {reason}" in d.evidence
    assert any("batch.log: absent" in e for e in d.evidence)
    assert "`sacct -j 4242`" in d.remedy and "slurmctld" in d.remedy
    (run_dir / "batch.log").write_text("treb: controller up on tn1\n")
    d = diagnose_run(run)
    assert "batch.log: treb: controller up on tn1" in d.evidence
    never = diagnose_run({**run, "backend_id": None, "reason": "never reached sbatch"})
    assert never.category == "node_failure" and "never reached sbatch" in never.summary
