"""srun job logs as Slurm writes them, attacked: two jobs' logs given together, terminal
control before srun's lines, srun's reduced task exit lines, a batch script of several
steps, Ctrl+C, and Slurm 25.05's scancel line in a rank's own log. Each wording is Slurm's
own (SchedMD/slurm: api/step_launch.c, srun/launch.c, srun/signals.c, srun/srun_job.c,
slurmstepd/req.c, api/allocate.c, salloc/salloc.c)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.fast.test_diagnose_stopped_by_slurm import ABORTED, CAPTURED, STOPPED, UP, _diagnose
from trebuchet.diagnose import catalog, lines, scan
from trebuchet.diagnose.report import diagnose_paths


def _treb(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "trebuchet", "diagnose", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


# -- 1. two jobs' logs -------------------------------------------------------------------------
def test_two_job_logs_given_together_are_refused_by_name(tmp_path: Path) -> None:
    """sbatch names a job's log slurm-%j.out (slurm-%A_%a.out for an array task): two of them
    are two jobs, not ranks 7 and 8 of one. Given together, as files or in a folder, they
    are refused, each named, exit 2 (one diagnosis of two jobs would be neither's)."""
    job = (CAPTURED / "slurm-2.out").read_text()
    both = tmp_path / "both"
    both.mkdir()
    for name in ("slurm-7.out", "slurm-8_1.out"):
        (both / name).write_text(job)
    for args in ([str(both / "slurm-7.out"), str(both / "slurm-8_1.out")], [str(both)]):
        out = _treb(*args)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "slurm-7.out" in out.stderr and "slurm-8_1.out" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and "rank 7" not in out.stdout


def test_a_folder_holding_one_job_log_reads_it_as_the_job_log(tmp_path: Path) -> None:
    """A folder with one slurm-2.out is that job's log, as the file itself is: srun's task
    lines are read (not 'rank 2 failed first')."""
    (tmp_path / "slurm-2.out").write_text((CAPTURED / "slurm-2.out").read_text())
    d = diagnose_paths([tmp_path])
    assert d.category == "stopped_by_slurm", d.summary
    assert {u.rank for u in d.units} == {0, 1}


# -- 2. terminal control before a line ---------------------------------------------------------
CONTROL = ["\x1b[0m", "\x1b[1;31m", "\r", "\x1b[0m\r", "\x1b]0;train\x07", " 50%|##   | 5/10\r",
           "\x1b[2K\r"]  # fmt: skip


@pytest.mark.parametrize("ctl", CONTROL)
def test_terminal_control_before_the_abort_hides_nothing(tmp_path: Path, ctl: str) -> None:
    """A colour reset or a progress bar's carriage return before `srun: Job step aborted`
    (srun's stderr shares the terminal with the tasks'): the line is still srun's."""
    d = _diagnose(tmp_path, UP + ctl + ABORTED + STOPPED)
    assert d.category == "stopped_by_slurm", d.summary
    assert ABORTED.strip() in d.evidence, d.evidence


SAMPLES = [
    # srun's task line (srun/launch.c) before its abort: that task is the failure
    UP + "srun: error: tn1: task 0: Killed\n" + ABORTED + "srun: error: tn2: task 1: Terminated\n",
    # srun/signals.c: Ctrl+C on srun
    UP + "srun: sending Ctrl-C to StepId=2.0\n" + ABORTED + STOPPED,
    # salloc/salloc.c: the allocation's time limit
    UP + ABORTED + "salloc: Job 2 has exceeded its time limit and its allocation has been "
    "revoked.\n" + STOPPED,
    # api/allocate.c: the job id in the sacct line
    "srun: job 41 has been allocated resources\n" + UP + ABORTED + STOPPED,
    # srun -l's labels name the rank whose traceback it is
    '0: Traceback (most recent call last):\n0:   File "train.py", line 3, in <module>\n'
    "0: ValueError: bad batch\nsrun: error: tn1: task 0: Exited with exit code 1\n",
    # the catalog's anchored rules: a shell's own words
    "0: bash: line 1: ./train.sh: Permission denied\nsrun: error: tn1: task 0: Exited with exit "
    "code 126\n",
]  # fmt: skip


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("ctl", ["\x1b[0m", "\x1b[0m\r"])
def test_terminal_control_before_any_anchored_line_changes_nothing(
    tmp_path: Path, sample: str, ctl: str
) -> None:
    plain = _diagnose(tmp_path, sample)
    assert plain.category not in (None, "unknown"), plain.summary
    lines = sample.splitlines(keepends=True)
    d = _diagnose(tmp_path, "".join(ctl + ln for ln in lines))
    assert (d.category, d.rank, d.remedy) == (plain.category, plain.rank, plain.remedy), d.summary


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["\x1b[0m", "\x1b[32m", "\x1b[?25l", "\r", "\x1b]2;x\x1b\\",
                                 "\x1b(B"]), max_size=3))  # fmt: skip
def test_any_colour_codes_before_each_line_read_the_same(
    tmp_path_factory: pytest.TempPathFactory, codes: list[str]
) -> None:
    ctl = "".join(codes)
    d = _diagnose(tmp_path_factory.mktemp("c"), "".join(ctl + ln for ln in
                                                        (UP + ABORTED + STOPPED).splitlines(True)))  # fmt: skip
    assert d.category == "stopped_by_slurm", (codes, d.summary)


# -- 3. SLURM_SRUN_REDUCE_TASK_EXIT_MSG --------------------------------------------------------
def test_reduced_task_exit_lines_read_as_the_tasks_they_name(tmp_path: Path) -> None:
    """With SLURM_SRUN_REDUCE_TASK_EXIT_MSG=1 srun prints a task exit only when its status
    differs from the previous one (srun/launch.c, _task_finish): tn2's tasks 2-3, stopped as
    tn1's were, have no line. A task without its own line ended as the line before it (or
    with 0, which srun never prints): no failure that keeps stopped_by_slurm from firing."""
    up = UP + "2: task 2 up\n3: task 3 up\n"
    said = "".join(f"{r}: caught signal 15 (SIGTERM), stopping\n" for r in range(4))
    d = _diagnose(tmp_path, up + ABORTED + said + "srun: error: tn1: tasks 0-1: Terminated\n")
    assert {u.rank for u in d.units} == {0, 1, 2, 3}
    assert d.category == "stopped_by_slurm", d.summary
    assert "srun: error: tn1: tasks 0-1: Terminated" in d.evidence
    # a failure is still one: tn1's exit code 1, the others reduced
    d = _diagnose(tmp_path, up + "srun: error: tn1: tasks 0-1: Exited with exit code 1\n" + ABORTED)
    assert d.category != "stopped_by_slurm" and d.rank == 0, d.summary


# -- 4. several steps --------------------------------------------------------------------------
def test_a_task_killed_in_a_later_step_is_not_the_earlier_aborts_kill(tmp_path: Path) -> None:
    """A batch script of two srun steps: the first is aborted (its tasks Terminated), the
    second's task 0 ends `Killed` with no oom-kill line. srun's SIGKILL after its abort
    (api/step_launch.c) is its own step's; that later Killed is the failure (kill -9, or the
    OOM killer whose line is missing)."""
    step2 = "0: step 2 up\n1: step 2 up\nsrun: error: tn1: task 0: Killed\n"
    d = _diagnose(tmp_path, UP + ABORTED + STOPPED + step2)
    assert (d.category, d.rank) == ("killed", 0), d.summary
    # srun's own end of the step (step_launch.c: Force Terminated), or the next step's start
    # (srun/launch.c: Step created for), closes it too
    for said in ("srun: Force Terminated StepId=2.0\n", "srun: Step created for StepId=2.1\n"):
        d = _diagnose(
            tmp_path, UP + ABORTED + STOPPED + said + "srun: error: tn2: task 2: Killed\n"
        )
        assert (d.category, d.rank) == ("killed", 2), (said, d.summary)
    # within the aborted step a Killed task is still srun's kill
    d = _diagnose(tmp_path, UP + ABORTED + "srun: error: tn1: task 0: Killed\n"
                  "srun: error: tn2: task 1: Terminated\n")  # fmt: skip
    assert d.category == "stopped_by_slurm", d.summary


# -- 5. Ctrl+C ---------------------------------------------------------------------------------
def test_the_ctrl_c_summary_is_treb_words_not_sruns_line(tmp_path: Path) -> None:
    """Ctrl+C twice on srun (srun/signals.c, then srun_job.c's `forcing job termination`):
    cancelled, worded as treb words a cancel; srun's line stays the evidence."""
    ctrl_c = ("srun: interrupt (one more within 1 sec to abort)\n"
              "srun: StepId=2.0 tasks 0-1: running\nsrun: sending Ctrl-C to StepId=2.0\n"
              "srun: forcing job termination\n")  # fmt: skip
    d = _diagnose(tmp_path, UP + ctrl_c + ABORTED + STOPPED)
    assert d.category == "cancelled", d.summary
    assert not d.summary.startswith("srun"), d.summary
    assert "Ctrl+C" in d.summary and "StepId=2.0" in d.summary and "nothing failed" in d.summary
    assert "srun: sending Ctrl-C to StepId=2.0" in d.evidence
    # Slurm before 20.11 (srun/signals.c: "sending Ctrl-C to job %u.%u") named it so
    d = _diagnose(tmp_path, UP + "srun: sending Ctrl-C to job 2.0\n" + ABORTED + STOPPED)
    assert d.category == "cancelled" and "the job step 2.0 was cancelled" in d.summary, d.summary


# -- 6. Slurm 25.05's scancel line in a rank's log ---------------------------------------------
SCANCEL_2505 = ("slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00 "
                "DUE to SIGNAL Terminated ***")  # fmt: skip  # slurmstepd/req.c


def test_slurm_2505s_scancel_in_a_rank_log_is_a_cancel(tmp_path: Path) -> None:
    """A folder of per-rank logs (srun -o rank-%t.log) holding slurmstepd's line: the
    catalog's rule reads it as a job log's reader does (one pattern for both)."""
    (tmp_path / "rank-0.log").write_text("step 1\n" + SCANCEL_2505 + "\n")
    (tmp_path / "rank-1.log").write_text("step 1\n")
    d = diagnose_paths([tmp_path])
    assert d.category == "cancelled", d.summary
    assert SCANCEL_2505 in d.evidence


@pytest.mark.parametrize(
    ("why", "category"),
    [("TIME LIMIT", "time_limit"), ("PREEMPTION", "cancelled"), ("NODE FAILURE", "node_failure"),
     ("JOB REQUEUE", "cancelled"), ("to SIGNAL Terminated", "cancelled"), ("TASK FAILURE", None),
     (None, "cancelled")],
)  # fmt: skip
def test_each_of_slurmstepds_cancel_lines_reads_the_same_in_both(
    tmp_path: Path, why: str | None, category: str | None
) -> None:
    """req.c's lines, read by the catalog (a rank's log) and by the job log's reader."""
    due = "" if why is None else f" DUE {why}" if why.startswith("to ") else f" DUE TO {why}"
    line = f"slurmstepd: error: *** STEP 2.0 ON tn1 CANCELLED AT 2026-12-06T21:00:00{due} ***"
    rule = catalog.match(line)
    assert (rule.category if rule and rule.category != "cascade" else None) == category, line
    d = _diagnose(tmp_path, UP + line + "\n" + ABORTED + STOPPED)
    if category is None:  # a task failed: no cancel, and not "does not say why" either
        assert d.category not in ("cancelled", "stopped_by_slurm"), d.summary
    else:
        assert d.category == category and line in d.evidence, d.summary


# -- 7. attacked: job logs by other names, bars before a traceback, strsignal's words ---------
TRACEBACK = ('Traceback (most recent call last):\n1:   File "/w/train.py", line 3, in <module>\n'
             "1:     1/0\n1: ZeroDivisionError: division by zero\n")  # fmt: skip
FAILED_1 = "srun: error: tn2: task 1: Exited with exit code 1\n"


def _bar(updates: int) -> str:
    """tqdm's bar as it reaches a file: one line of carriage-return-separated updates."""
    return "".join(f"\r{i / 10:5.1f}%|{'#' * (i // 50):<20}| {i}/1000 [00:{i % 60:02d}<00:10, "
                   f"99.0it/s]" for i in range(updates))  # fmt: skip


@pytest.mark.parametrize("updates", [30, 4000])
def test_a_traceback_after_an_srun_labelled_progress_bar_stays_its_ranks(
    tmp_path: Path, updates: int
) -> None:
    """tqdm writes its bar to stderr with no newline, so the traceback Python writes next
    shares its line, and srun -l labels that line once, before the bar: `1:  0.0%|...\\r...
    Traceback (most recent call last):`. The traceback is rank 1's, with its frame; after a
    bar of 4000 updates too (240 kB: longer than the chunks the scanner had read when it
    found that line's end, so its start was cut off with the traceback's header)."""
    before = "".join(f"0: step {i} loss 1.0\n1: step {i} loss 1.0\n" for i in range(2000))
    d = _diagnose(tmp_path, before + "1: " + _bar(updates) + TRACEBACK + FAILED_1)
    assert (d.category, d.rank) == ("python_exception", 1), d.summary
    assert d.frame is not None and "train.py:3" in d.frame, (d.frame, d.summary)


def test_a_job_logs_other_names_are_not_a_ranks(tmp_path: Path) -> None:
    """sbatch -e slurm-%j.err (srun's own lines go to the job's stderr) and -o %x-%j.out:
    in a folder each is the job's log, read for srun's task lines, never rank 4242's."""
    srun_said = "1: " + TRACEBACK + FAILED_1 + ABORTED + "srun: error: tn1: task 0: Killed\n"
    for files in ({"slurm-4242.out": "0: up\n1: up\n", "slurm-4242.err": srun_said},
                  {"train-4242.out": srun_said}):  # fmt: skip
        folder = tmp_path / "-".join(files)
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        d = diagnose_paths([folder])
        assert (d.category, d.rank) == ("python_exception", 1), (files, d.summary)
        assert 4242 not in {u.rank for u in d.units}, files


def test_a_folder_among_several_paths_is_refused_by_name(tmp_path: Path) -> None:
    """Two jobs' folders (or a folder and a log) given together: only files were read, a
    folder silently not, and `treb diagnose job1/ job2/` said 'no failure found in ' (no
    name), exit 0. A folder is read alone; given among others it is refused, named."""
    for job, text in (("job1", "slurm-7.out"), ("job2", "slurm-8.out")):
        (tmp_path / job).mkdir()
        (tmp_path / job / text).write_text(UP + FAILED_1)
    for args in ([tmp_path / "job1", tmp_path / "job2"], [tmp_path / "job1", tmp_path / "job2"
                                                          / "slurm-8.out"]):  # fmt: skip
        out = _treb(*map(str, args))
        assert out.returncode == 2, out.stdout + out.stderr
        assert str(tmp_path / "job1") in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_per_task_logs_named_slurm_N_out_are_ranks(tmp_path: Path) -> None:
    """srun -o slurm-%t.out writes a task's output to slurm-0.out, slurm-1.out: no job's
    logs (Slurm numbers its jobs from 1), so a folder of them is read as ranks, not refused."""
    (tmp_path / "slurm-0.out").write_text("step 1\n")
    (tmp_path / "slurm-1.out").write_text("step 1\n" + TRACEBACK.replace("1: ", ""))
    for args in ([str(tmp_path)], [str(tmp_path / "slurm-0.out"), str(tmp_path / "slurm-1.out")]):
        out = _treb("--json", *args)
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)["root_cause"]
        assert (d["category"], d["rank"]) == ("python_exception", 1), d["summary"]


def test_a_job_log_given_beside_rank_logs_keeps_their_ranks(tmp_path: Path) -> None:
    """`treb diagnose slurm-5.out rank-0.log rank-1.log` reads as the folder holding them:
    each rank log is its rank's (its traceback rank 1's, with its frame), the job log is
    read for srun's lines."""
    (tmp_path / "slurm-5.out").write_text(UP + FAILED_1 + ABORTED + "srun: error: tn1: task 0: "
                                          "Killed\n")  # fmt: skip
    (tmp_path / "rank-0.log").write_text("step 1\n")
    (tmp_path / "rank-1.log").write_text("step 1\n" + TRACEBACK.replace("1: ", ""))
    folder = diagnose_paths([tmp_path])
    files = diagnose_paths(sorted(tmp_path.iterdir()))
    for d in (folder, files):
        assert (d.category, d.rank) == ("python_exception", 1), d.summary
        assert d.frame is not None and "train.py:3" in d.frame, d.frame


@pytest.mark.parametrize(
    ("said", "signal"),
    [("User defined signal 1", "SIGUSR1"), ("Broken pipe", "SIGPIPE"), ("Quit", "SIGQUIT"),
     ("CPU time limit exceeded", "SIGXCPU"), ("Segmentation fault (core dumped)", "SIGSEGV")],
)  # fmt: skip
def test_every_signal_srun_names_is_a_task_failure(tmp_path: Path, said: str, signal: str) -> None:
    """srun names a task's signal by strsignal() (srun/launch.c, _task_finish): SIGUSR1 (an
    sbatch --signal=USR1 no handler caught), SIGPIPE, SIGQUIT, SIGXCPU are failures of that
    task too, not a log 'read as one process'. SIGXCPU is the process's CPU-time rlimit
    (ulimit -t), not the job's time limit."""
    d = _diagnose(tmp_path, UP + f"srun: error: tn2: task 1: {said}\n")
    assert d.rank == 1 and d.node == "tn2", d.summary
    assert d.category != "time_limit", d.summary
    assert {u.rank: u.signal for u in d.units}[1] == signal


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["\r", "\x1b", "[", "]", ";", "?", "0", "12", ": ", " ", "P1 ",
                                 "[rank1]:", "[1,2]<stderr>:", "a", "\t", "\x07", "\x9b",
                                 "\u2028", "\\"]) | st.characters()).map("".join))  # fmt: skip
@example("[rank1]:\ra\rb")
def test_visible_leaves_no_control_whatever_the_line(line: str) -> None:
    """Any line: what lines.visible leaves holds no carriage return and no ESC (a label it
    keeps included), is no longer than the line, and reads the same a second time."""
    shown = lines.visible(line)
    assert "\r" not in shown and "\x1b" not in shown, (line, shown)
    assert len(shown) <= len(line) and lines.visible(shown) == shown, (line, shown)


@pytest.mark.parametrize("cut", [16, 18, 19])
def test_a_line_across_the_scanners_chunk_boundary_is_read(tmp_path: Path, cut: int) -> None:
    """The scanner reads a log backwards in chunks (scan.CHUNK from the end first) and finds
    its candidate lines by keyword in each: `srun: Job step a|borted` with the boundary
    inside `abort` was in neither chunk, and the stop read as no failure at all."""
    tail = ABORTED[cut:] + STOPPED
    pad = "x" * (scan.CHUNK - len(tail) - 1) + "\n"  # the boundary falls at ABORTED[cut]
    before = "".join(f"0: step {i}\n1: step {i}\n" for i in range(2000))
    d = _diagnose(tmp_path, before + UP + ABORTED[:cut] + tail + pad)
    assert d.category == "stopped_by_slurm", d.summary
    assert ABORTED.strip() in d.evidence, d.evidence


def test_a_logs_last_lines_are_the_lines_a_terminal_shows(tmp_path: Path) -> None:
    """A log's last lines (the 'last line:' evidence, exit_abort's test) are its lines as
    visible reads them: a progress bar's updates are one line, its last, not one line each
    (str.splitlines cut at every carriage return), and Windows line ends read the same."""
    for end in ("\n", "\r\n"):
        log = tmp_path / "rank-0.log"
        log.write_text(f"loss 1.0{end}" + _bar(40) + end)
        last = scan.scan(log).last_lines
        assert last == ["loss 1.0", _bar(40).rsplit("\r", 1)[-1]], last
        # past the 4 kB the last lines are read from: a cut line is left out, a bar's end kept
        log.write_text("y" * 5000 + end + "x" * 5000 + end + "loss 1.0" + end)
        assert scan.scan(log).last_lines == ["loss 1.0"]
        log.write_text("y" * 5000 + end + "loss 1.0" + end + _bar(40) + end)
        assert scan.scan(log).last_lines == ["loss 1.0", _bar(40).rsplit("\r", 1)[-1]]
        log.write_text("loss 1.0" + end + _bar(200) + end)  # 12 kB of bar: its end is the line
        assert scan.scan(log).last_lines == [_bar(200).rsplit("\r", 1)[-1]]


def test_a_step_srun_could_not_create_is_the_jobs_failure(tmp_path: Path) -> None:
    """A batch script's later step asking for more than the job has (srun/launch.c: `Unable
    to create step for job %u: %m`): Slurm refused it, nothing of it ran. After srun's
    abort, `Job/step already completing` is the job's end, no refusal: stopped_by_slurm."""
    refused = (
        "srun: error: Unable to create step for job 5: More processors requested than permitted\n"  # noqa: E501
    )
    d = _diagnose(tmp_path, UP + refused)
    assert d.category == "scheduler_refusal", d.summary
    assert refused.strip() in d.evidence, d.evidence
    ended = (
        "srun: error: Unable to create step for job 5: Job/step already completing or completed\n"  # noqa: E501
    )
    d = _diagnose(tmp_path, UP + ABORTED + STOPPED + ended)
    assert d.category == "stopped_by_slurm", d.summary
