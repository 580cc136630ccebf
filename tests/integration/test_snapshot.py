"""Code snapshots: the run executes the code as it was at submission."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})  # fmt: skip


def test_edit_after_submit_runs_the_old_code(treb, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('version one')\n")
    spec = write_spec(tmp_path, "command: 'sleep 1.5; python train.py'\n")
    run_id = treb("run", str(spec), "--detach").stdout.strip()
    (tmp_path / "train.py").write_text("print('version two')\n")  # edited while it waits
    deadline = time.monotonic() + 60
    while (
        status_json(treb, run_id)["state"] not in ("SUCCEEDED", "FAILED")
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert treb("logs", run_id, "--rank", "0").stdout == "version one\n"


def test_git_workdir_snapshot_records_commit_dirty_and_untracked(treb, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('committed')\n")
    (repo / ".gitignore").write_text("data/\n")
    git(repo, "init", "-q")
    git(
        repo,
        "add",
        "train.py",
        ".gitignore",
    )
    git(repo, "commit", "-qm", "first")
    (repo / "train.py").write_text(
        "import os; print(sorted(os.listdir('.')))\n"
    )  # uncommitted edit
    (repo / "helper.py").write_text("x = 1\n")  # untracked, not ignored: included
    (repo / "data").mkdir()
    (repo / "data" / "big.bin").write_bytes(b"0" * 1000)  # ignored
    spec = write_spec(repo, "command: python train.py\n")
    git(repo, "add", "job.yaml")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    assert "left out of the code snapshot" not in res.stderr
    # the edit ran, not the commit; the untracked helper is there, the ignored data/ is not
    assert "['.gitignore', 'helper.py', 'job.yaml', 'train.py']" in res.stdout
    st = status_json(treb)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    assert st["git_commit"] == head and st["git_dirty"] == 1
    snap = json.loads((Path(st["run_dir"]) / "snapshot.json").read_text())
    assert snap["files"] == 4 and snap["untracked"] == ["helper.py"]
    assert f"code    git {head[:12]} with uncommitted changes" in treb("status").stdout


def test_trebignore_and_gitignore_outside_git(treb, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import os; print(sorted(os.listdir('.')))\n")
    (tmp_path / ".gitignore").write_text("*.ckpt\n")
    (tmp_path / ".trebignore").write_text("notes/\n")
    (tmp_path / "model.ckpt").write_text("weights")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("x")
    spec = write_spec(tmp_path, "command: python train.py\n")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    assert "['.gitignore', '.trebignore', 'job.yaml', 'train.py']" in res.stdout


def test_size_limit_and_running_in_place(treb, treb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(b"\0" * (3 << 20))
    spec = write_spec(tmp_path, "command: pwd\nsnapshot_max_size: 1MB\n")
    res = treb("run", str(spec))
    assert res.returncode == 2 and "over the 1.0 MB limit (largest: blob.bin" in res.stderr
    assert not (treb_home / "runs").exists() or not list((treb_home / "runs").iterdir())
    res = treb("run", str(spec), "-o", "snapshot=false")
    assert res.returncode == 0 and res.stdout.strip().endswith(str(tmp_path))
    res = treb("run", str(spec), "-o", "snapshot_max_size=10MB")
    assert res.returncode == 0 and res.stdout.strip().endswith("/code")


def test_a_virtualenv_in_the_workdir_is_left_out_and_said_once(treb, tmp_path: Path) -> None:
    """Issue 25: a workdir holding a virtualenv made the snapshot refuse the run (its
    site-packages over snapshot_max_size). A folder with pyvenv.cfg is left out, said once
    on the terminal and kept in snapshot.json; the run runs."""
    venv = tmp_path / ".venv"
    (venv / "lib" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "lib" / "site-packages" / "big.so").write_bytes(b"\0" * (3 << 20))
    (tmp_path / "train.py").write_text("import os; print(sorted(os.listdir('.')))\n")
    spec = write_spec(tmp_path, "command: python train.py\nsnapshot_max_size: 1MB\n")
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[0:0] ['job.yaml', 'train.py']"
    assert res.stderr.count("leaves out the virtualenv .venv/ (a folder with pyvenv.cfg)") == 1
    run_dir = Path(status_json(treb)["run_dir"])
    assert json.loads((run_dir / "snapshot.json").read_text())["venvs"] == [".venv"]
