"""Virtualenvs in the workdir are left out of the code snapshot, by pyvenv.cfg (issue 25: a
workdir holding one made the snapshot refuse the run); inside git and outside it. A real
`treb run`: tests/integration/test_snapshot.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from trebuchet.launcher.snapshot import take, venv_note, why_missing

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}  # fmt: skip


def _workdir(root: Path) -> Path:
    work = root / "work"
    for venv in (work / "venv", work / "sub" / ".env"):
        (venv / "lib" / "site-packages").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (venv / "lib" / "site-packages" / "big.so").write_bytes(b"\0" * (2 << 20))
        (venv / "bin").mkdir()
        (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (work / "sub" / "data.txt").write_text("x\n")
    (work / "venvish").mkdir()  # a name like a venv's, without pyvenv.cfg: kept
    (work / "venvish" / "keep.py").write_text("x = 1\n")
    (work / "train.py").write_text("print(1)\n")
    return work


@pytest.mark.parametrize("in_git", [False, True])
def test_venvs_are_left_out_under_the_size_limit(in_git: bool, tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    if in_git:
        subprocess.run(["git", "init", "-q", str(work)], check=True, env=GIT_ENV)
    snap = take(work, tmp_path / "code", max_bytes=1 << 20)  # the venvs alone are 4 MB
    assert snap.venvs == ["sub/.env", "venv"]
    got = sorted(str(p.relative_to(tmp_path / "code")) for p in (tmp_path / "code").rglob("*")
                 if p.is_file())  # fmt: skip
    assert got == ["sub/data.txt", "train.py", "venvish/keep.py"]
    assert snap.skipped == {}


def test_the_note_and_the_diagnosis(tmp_path: Path) -> None:
    assert venv_note(["venv"]).startswith("the code snapshot leaves out the virtualenv venv/ ")
    assert "virtualenvs a/, b/" in venv_note(["a", "b"])
    run = tmp_path / "run"
    (run / "code").mkdir(parents=True)
    (run / "snapshot.json").write_text(json.dumps(
        {"path": str(run / "code"), "source": "/home/u/proj", "venvs": ["venv"]}))  # fmt: skip
    why = why_missing(run, ["bash: line 1: venv/bin/python: No such file or directory"])
    assert why and why.startswith("venv/bin/python is in the virtualenv venv/")
    assert "/home/u/proj/venv/bin/python" in why
