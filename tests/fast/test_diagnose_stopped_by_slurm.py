"""`stopped_by_slurm` (engine._stopped_by_slurm) attacked: a job log in which Slurm DID say
why the tasks were stopped must say that cause, not "this log does not say why", and the
`sacct` line must name the job the log is of. Each wording is Slurm's own (SchedMD/slurm:
slurmstepd/req.c, srun/signals.c, salloc/salloc.c, api/allocate.c, srun/launch.c)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.diagnose.report import diagnose_paths

CAPTURED = Path(__file__).resolve().parent.parent / "fixtures" / "diagnose" / "captured"
UP = "0: task 0 up\n1: task 1 up\n"
ABORTED = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
STOPPED = "srun: error: tn2: task 1: Terminated\nsrun: error: tn1: task 0: Terminated\n"


def _diagnose(tmp_path: Path, text: str, name: str = "slurm-2.out"):  # type: ignore[no-untyped-def]
    log = tmp_path / name
    log.write_text(text)
    return diagnose_paths([log])


@pytest.mark.parametrize(
    ("said", "category"),
    [
        # scancel on Slurm >= 25.05 (req.c: "DUE to SIGNAL %s", strsignal's words)
        ("slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00 "
         "DUE to SIGNAL Terminated ***", "cancelled"),
        # salloc's own line at the allocation's time limit (salloc.c)
        ("salloc: Job 2 has exceeded its time limit and its allocation has been revoked.",
         "time_limit"),
        # the allocation taken away otherwise (scancel of the salloc job)
        ("salloc: Job allocation 2 has been revoked.", "cancelled"),
    ],
)  # fmt: skip
def test_a_stop_whose_cause_slurm_printed_is_that_cause(
    tmp_path: Path, said: str, category: str
) -> None:
    d = _diagnose(tmp_path, UP + ABORTED + said + "\n" + STOPPED)
    assert d.category == category, d.summary
    assert said in d.evidence


def test_ctrl_c_on_srun_is_a_cancel(tmp_path: Path) -> None:
    """Ctrl+C twice on srun, as Slurm's docs show it (srun/signals.c): the user stopped the
    job; with or without the tasks' SIGTERM lines, it is cancelled, not 'does not say why'
    nor 'the process failed first'."""
    ctrl_c = ("srun: interrupt (one more within 1 sec to abort)\n"
              "srun: StepId=2.0 tasks 0-1: running\nsrun: sending Ctrl-C to StepId=2.0\n")  # fmt: skip
    for tail in (STOPPED, ""):
        d = _diagnose(tmp_path, UP + ctrl_c + ABORTED + tail)
        assert d.category == "cancelled", d.summary
        assert "srun: sending Ctrl-C to StepId=2.0" in d.evidence


def test_tasks_stopped_by_sigint_or_sighup_are_read(tmp_path: Path) -> None:
    """srun words a task's signal with strsignal (launch.c): SIGINT is `Interrupt`, SIGHUP
    `Hangup`; every task stopped so, after srun's abort, is stopped_by_slurm."""
    for word in ("Interrupt", "Hangup"):
        d = _diagnose(tmp_path, UP + ABORTED + f"srun: error: tn1: tasks 0-1: {word}\n")
        assert d.category == "stopped_by_slurm", (word, d.summary)
        assert f"srun: error: tn1: tasks 0-1: {word}" in d.evidence


def test_a_core_dumping_stop_is_evidence(tmp_path: Path) -> None:
    d = _diagnose(
        tmp_path, UP + ABORTED + STOPPED.replace("Terminated\n", "Terminated (core dumped)\n", 1)
    )
    assert d.category == "stopped_by_slurm", d.summary
    assert "srun: error: tn2: task 1: Terminated (core dumped)" in d.evidence


@pytest.mark.parametrize(
    ("name", "text", "job"),
    [
        # not sbatch's name, but srun said which job it ran in (api/allocate.c)
        ("train.log", None, "2"),
        # an array task (sbatch's slurm-%A_%a.out): sacct -j 1_2 is that task, -j 1 all
        ("slurm-1_2.out", UP + ABORTED + STOPPED, "1_2"),
        # srun's own line of the step it force-terminated (%ps: StepId=7.0, or JobId=7)
        ("train.log", UP + ABORTED + STOPPED + "srun: Force Terminated StepId=7.0\n", "7"),
        ("train.log", UP + ABORTED + STOPPED + "srun: Force Terminated JobId=7\n", "7"),
    ],
)
def test_the_sacct_line_names_the_job_the_log_is_of(
    tmp_path: Path, name: str, text: str | None, job: str
) -> None:
    d = _diagnose(tmp_path, text or (CAPTURED / "slurm-2.out").read_text(), name)
    assert d.category == "stopped_by_slurm", d.summary
    assert f"`sacct -j {job} -o " in d.summary and f"sacct -j {job} -o " in d.remedy
    assert "JOBID" not in d.remedy


@pytest.mark.parametrize("name", ["slurm-\u0662\u0663.out", "slurm-99999999999999999999.out",
                                  "slurm-2\u00b2.out", "slurm-.out"])  # fmt: skip
def test_a_name_that_is_no_job_id_gives_none(tmp_path: Path, name: str) -> None:
    """Digits of other scripts, or more than a job id holds, are no job id: the remedy keeps
    its placeholder rather than a `sacct -j` of something Slurm never named."""
    d = _diagnose(tmp_path, UP + ABORTED + STOPPED, name)
    assert d.category == "stopped_by_slurm", d.summary
    assert "sacct -j JOBID -o " in d.remedy and "`sacct -j JOBID -o " in d.summary


def test_json_and_text_say_the_same(tmp_path: Path) -> None:
    """`treb diagnose --json` and the text report: one category, one sacct line."""
    log = tmp_path / "slurm-2.out"
    log.write_text((CAPTURED / "slurm-2.out").read_text())
    cmd = [sys.executable, "-m", "trebuchet", "diagnose", str(log)]
    js = subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=False)
    tx = subprocess.run(cmd, capture_output=True, text=True, check=False)
    root = json.loads(js.stdout)["root_cause"]
    assert root["category"] == "stopped_by_slurm" and "sacct -j 2 -o " in root["remedy"]
    assert "stopped_by_slurm" in tx.stdout or "stopped by Slurm" in tx.stdout, tx.stdout
    assert "sacct -j 2 -o " in tx.stdout and "JOBID" not in tx.stdout + js.stdout
    assert "Traceback" not in tx.stderr + js.stderr


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60), st.sampled_from(["slurm-2.out", "x.log", "slurm-1_2.out"]))
def test_any_line_around_the_abort_reads(tmp_path_factory: pytest.TempPathFactory, junk: str,
                                         name: str) -> None:  # fmt: skip
    """Hostile text next to srun's lines (ESC, NUL, lone surrogates, U+2028): no exception,
    and a sacct line only with a job id of ASCII digits."""
    log = tmp_path_factory.mktemp("h") / name
    log.write_bytes((UP + junk + "\n" + ABORTED + STOPPED).encode("utf-8", "surrogatepass"))
    d = diagnose_paths([log])
    if d.category == "stopped_by_slurm":
        job = d.remedy.split("sacct -j ", 1)[1].split(" ", 1)[0]
        assert job == "JOBID" or job.replace("_", "").isascii() and job.replace("_", "").isdigit()


def test_a_step_cancelled_due_to_task_failure_is_that_task(tmp_path: Path) -> None:
    """Slurm >= 25.05 words the step killed because a task failed (--kill-on-bad-exit)
    `CANCELLED AT ... DUE TO TASK FAILURE` (req.c), and may print it before srun's line of
    the task: that task is the failure, not a cancel in which nothing failed."""
    said = ("slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00 "
            "DUE TO TASK FAILURE ***\n")  # fmt: skip
    failed = "srun: error: tn1: task 0: Exited with exit code 3\n"
    d = _diagnose(tmp_path, UP + said + ABORTED + failed + "srun: error: tn2: task 1: Terminated\n")
    assert (d.category, d.rank) == ("unknown", 0), d.summary


def test_tasks_srun_killed_after_its_abort_are_stopped(tmp_path: Path) -> None:
    """After `Job step aborted` srun sends the step SIGKILL (api/step_launch.c): a task that
    outlived the stop signal (it traps SIGTERM, or KillWait ran out) ends `Killed`. That is
    srun's kill, not the OOM killer's: the job was stopped from outside."""
    killed = "srun: error: tn1: task 0: Killed\nsrun: error: tn2: task 1: Terminated\n"
    d = _diagnose(tmp_path, UP + ABORTED + killed)
    assert d.category == "stopped_by_slurm", d.summary
    assert {d.roles[id(u)] for u in d.units} == {"stopped"}
    assert "srun: error: tn1: task 0: Killed" in d.evidence
    d = _diagnose(tmp_path, UP + ABORTED + "srun: error: tn1: tasks 0-1: Killed\n")
    assert d.category == "stopped_by_slurm", d.summary


def test_a_task_killed_before_the_abort_is_the_failure(tmp_path: Path) -> None:
    """The same line BEFORE srun's abort (the OOM killer, a kill -9; srun then aborts the
    step): that task is the failure."""
    killed = "srun: error: tn1: task 0: Killed\n"
    d = _diagnose(tmp_path, UP + killed + ABORTED + "srun: error: tn2: task 1: Terminated\n")
    assert (d.category, d.rank) == ("killed", 0), d.summary


@pytest.mark.parametrize("stop", ["Killed", "Interrupt", "Hangup"])
def test_slurms_reason_after_the_stopped_tasks_still_counts(tmp_path: Path, stop: str) -> None:
    """slurmstepd's line may reach the log after srun's task lines: a task stopped by the
    abort (Killed) or by a stop signal is no failure that makes the reason a cascade."""
    said = ("slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00 "
            "DUE TO TIME LIMIT ***\n")  # fmt: skip
    d = _diagnose(tmp_path, UP + ABORTED + f"srun: error: tn1: tasks 0-1: {stop}\n" + said)
    assert d.category == "time_limit", d.summary


@pytest.mark.parametrize("said", [
    "slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00 DUE TO TASK FAILURE ***",
    "slurmstepd: error: *** STEP 2.0 ON tn1 FAILED (non-zero exit code or other failure mode) ***",
])  # fmt: skip
def test_slurm_saying_a_failure_is_not_said_to_say_nothing(tmp_path: Path, said: str) -> None:
    """slurmstepd said the step failed (req.c), though no task's line shows which: not
    "none failed on its own; this log does not say why", and its line is the evidence."""
    d = _diagnose(tmp_path, UP + said + "\n" + ABORTED + STOPPED)
    assert d.category != "stopped_by_slurm", d.summary
    assert said in d.evidence


@pytest.mark.parametrize("tasks", ["0-4294967295", "0-99999999999999999999", "5-1,0-1"])
def test_a_hostile_task_range_is_read_without_building_it(tmp_path: Path, tasks: str) -> None:
    """`tasks 0-4294967295` (Slurm's task ids are 32-bit; a log can say anything): the
    range is not built in memory (it raised MemoryError), and the tasks it names are read."""
    d = _diagnose(tmp_path, UP + ABORTED + f"srun: error: tn1: tasks {tasks}: Terminated\n")
    assert d.category == "stopped_by_slurm", d.summary
    assert {0, 1} <= {u.rank for u in d.units}


TORCHRUN_STOPPED = """\
{r}: [2026-12-06 21:00:00,000] torch.distributed.elastic.agent.server.api: [WARNING] Received \
Signals.SIGTERM death signal, shutting down workers
{r}: Traceback (most recent call last):
{r}:   File "/usr/bin/torchrun", line 8, in <module>
{r}:     sys.exit(main())
{r}: torch.distributed.elastic.multiprocessing.api.SignalException: Process 12{r}0 got signal: 15
"""


def test_torchrun_inside_srun_stopped_by_slurm(tmp_path: Path) -> None:
    """torchrun under srun at a time limit: slurmstepd's SIGTERM reaches each node's torchrun,
    which stops its workers and raises SignalException (torch's elastic agent), so srun
    reports `Exited with exit code 1`. Nothing failed: stopped_by_slurm, not 'rank 0 failed
    first (exit code 1)'."""
    srun_end = ("srun: error: tn1: task 0: Exited with exit code 1\n"
                "srun: error: tn2: task 1: Exited with exit code 1\n")  # fmt: skip
    text = UP + ABORTED + TORCHRUN_STOPPED.format(r=0) + TORCHRUN_STOPPED.format(r=1) + srun_end
    d = _diagnose(tmp_path, text)
    assert d.category == "stopped_by_slurm", d.summary
    assert {d.roles[id(u)] for u in d.units} == {"stopped"}
    assert any("got signal: 15" in e for e in d.evidence), d.evidence


def test_torchrun_whose_worker_failed_is_that_failure(tmp_path: Path) -> None:
    """The same job where node 0's worker raised first: node 1's torchrun was stopped, and
    node 0's error is the diagnosis."""
    failed = ("0: [rank0]: Traceback (most recent call last):\n"
              '0: [rank0]:   File "train.py", line 9, in <module>\n'
              "0: [rank0]: ValueError: bad batch\n")  # fmt: skip
    srun_end = ("srun: error: tn1: task 0: Exited with exit code 1\n"
                "srun: error: tn2: task 1: Exited with exit code 1\n")  # fmt: skip
    d = _diagnose(tmp_path, UP + failed + ABORTED + TORCHRUN_STOPPED.format(r=1) + srun_end)
    assert d.category == "python_exception" and d.rank == 0, d.summary


def test_a_log_that_is_no_file_is_a_named_error(tmp_path: Path) -> None:
    """A FIFO (or a device) named like a job log is not read, and not silently skipped
    either: `no failure found in ` with no name and exit 0 said nothing true."""
    import os

    fifo = tmp_path / "slurm-3.out"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-m", "trebuchet", "diagnose", str(fifo)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert str(fifo) in out.stderr and "Traceback" not in out.stderr


def test_a_task_killed_after_the_abort_in_an_oom_log_is_the_oom_victim(tmp_path: Path) -> None:
    """slurmstepd's oom-kill line (slurm's cgroup plugin) in the log: the task that ended
    `Killed` is the OOM killer's, wherever srun's abort line fell; it stays the root cause."""
    oom = ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4.0 cgroup. Some of "
           "your processes may have been killed by the cgroup out-of-memory handler.\n")  # fmt: skip
    killed = "srun: error: tn1: task 0: Killed\nsrun: error: tn2: task 1: Terminated\n"
    d = _diagnose(tmp_path, UP + ABORTED + killed + oom)
    assert (d.category, d.rank) == ("killed", 0), d.summary
    # the kernel's own words, as a node's console or dmesg copied into the log has them: the
    # same as the catalog's `killed` rule reads (catalog.OOM_KILLED, one pattern for both)
    kernel = "Memory cgroup out of memory: Killed process 4242 (python) total-vm:9000kB\n"
    d = _diagnose(tmp_path, UP + ABORTED + killed + kernel)
    assert (d.category, d.rank) == ("killed", 0), d.summary
