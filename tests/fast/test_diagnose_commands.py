"""A command that cannot start (not found, not executable, not valid shell) is `bad_command`,
and SIGABRT is `aborted`, not a segfault (issue 25: exit 127 and bash syntax errors read
`cause: unknown`, SIGABRT was called a segfault).

The shells' messages are produced here by the real shells (bash, dash, zsh when installed);
the srun line that carries the exit code is Slurm's format, as in ../fixtures/diagnose/.
The same failures from real `treb run`s: tests/integration/test_diagnose_runs.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trebuchet.diagnose import catalog
from trebuchet.diagnose.report import diagnose_paths


def _shell_says(shell: str, script: str, cwd: Path) -> tuple[str, int]:
    path = shutil.which(shell)
    if path is None:
        pytest.skip(f"{shell} is not installed")
    res = subprocess.run([path, "-c", script], capture_output=True, text=True, cwd=cwd)
    return res.stderr, res.returncode


@pytest.mark.parametrize(
    "shell,script,code,said",
    [
        ("bash", "no-such-trainer-xyz --lr 0.1", 127, "no-such-trainer-xyz: command not found"),
        ("sh", "no-such-trainer-xyz", 127, "no-such-trainer-xyz: not found"),
        ("zsh", "no-such-trainer-xyz", 127, "command not found: no-such-trainer-xyz"),
        ("bash", "echo )", 2, "syntax error near unexpected token"),
        ("sh", "echo )", 2, "Syntax error"),
        ("bash", "if true; then echo", 2, "syntax error: unexpected end of file"),
        ("bash", "./train.sh", 126, "Permission denied"),
        ("bash", "./noshebang-interp.sh", 127, "No such file or directory"),
    ],
)
def test_a_command_that_cannot_start(shell: str, script: str, code: int, said: str,
                                     tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "train.sh").write_text("echo hi\n")  # not executable
    interp = tmp_path / "noshebang-interp.sh"
    interp.write_text("#!/usr/bin/env no-such-interpreter-xyz\n")
    interp.chmod(0o755)
    err, rc = _shell_says(shell, script, tmp_path)
    assert rc == code and said in err, (rc, err)
    log = tmp_path / "job.log"
    log.write_text(err + f"srun: error: tn1: task 0: Exited with exit code {rc}\n")
    d = diagnose_paths([log])
    assert d.category == "bad_command", (d.category, d.summary)
    assert said in d.summary or said in " ".join(d.evidence), d.summary
    assert "not installed where the ranks run" in d.remedy


def test_exit_127_alone_is_bad_command(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("srun: error: tn1: task 0: Exited with exit code 127\n")
    d = diagnose_paths([log])
    assert d.category == "bad_command" and "the command was not found" in d.summary


def test_a_missing_module_is_still_missing_module(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("ModuleNotFoundError: No module named 'flash_attn'\n"
                   "srun: error: tn1: task 0: Exited with exit code 1\n")  # fmt: skip
    assert diagnose_paths([log]).category == "missing_module"


@pytest.mark.parametrize(
    "lines",
    [
        "",  # the exit code alone
        "terminate called after throwing an instance of 'c10::Error'\n  what():  boom\n",
        "Fatal Python error: Aborted\n",
    ],
)
def test_sigabrt_is_aborted_not_a_segfault(lines: str, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(lines + "srun: error: tn1: task 0: Exited with exit code 134\n")
    d = diagnose_paths([log])
    assert d.category == "aborted", (d.category, d.summary)
    assert "SIGABRT" in d.summary and "uncaught C++ exception" in d.remedy
    assert catalog.SIGNAL_CATEGORY["SIGSEGV"] == "segfault"
    assert "abort" not in catalog.TITLES["segfault"]


def test_sigsegv_is_still_a_segfault(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("srun: error: tn1: task 0: Exited with exit code 139\n")
    assert diagnose_paths([log]).category == "segfault"
