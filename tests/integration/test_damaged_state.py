"""State that must survive damage: a damaged runs.db, a TREB_HOME that is a file, read-only
or full, snapshots that meet special, unreadable, vanishing files or a full disk.

Every case: a named error (exit 2) or a recorded cause, never a traceback, nothing lost
silently. Root ignores file modes, so read-only and full disks are real mounts (a
read-only bind mount, a small tmpfs) and unreadable files are read as another user (a
user namespace); each mount is undone even when the test fails."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration

PY = sys.executable


def _mount(*args: str) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount here ({res.stderr.strip() or 'mount failed'}): needs root")


@contextlib.contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at `path` (a full disk on demand), unmounted whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", options, "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """`path` seen through a read-only bind mount (root cannot write there either)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    view = path.with_name(path.name + "-ro")
    view.mkdir()
    _mount("--bind", str(path), str(view))
    try:
        _mount("-o", "remount,ro,bind", str(view))
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def clean_error(res: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2, a `treb:` message holding `words`, no traceback."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout, res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


def two_runs(treb, tmp_path: Path) -> dict[str, str]:
    """A succeeded and a failed run (2 ranks, rank 1 exits 3): {id: state}."""
    ok = write_spec(tmp_path / "w", "command: 'echo fine'\n", "ok.yaml")
    bad = write_spec(
        tmp_path / "w",
        "command: [python, -c, 'import os, sys; sys.exit(3 * int(os.environ[\"RANK\"]))']\n"
        "procs_per_node: 2\n",
        "bad.yaml",
    )
    assert treb("run", str(ok)).returncode == 0
    assert treb("run", str(bad)).returncode == 1
    return {r["id"]: r["state"] for r in json.loads(treb("ps", "--json").stdout)}


def zero_page(db: Path) -> None:
    """Zero the first page that holds rows (what a bad sector or a torn write leaves)."""
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[2 * page : 3 * page] = bytes(page)
    db.write_bytes(bytes(data))


DAMAGE = {
    "empty": lambda db: db.write_bytes(b""),
    "truncated": lambda db: db.write_bytes(db.read_bytes()[:5000]),
    "truncated-to-pages": lambda db: db.write_bytes(db.read_bytes()[:8192]),
    "random-bytes": lambda db: db.write_bytes(os.urandom(db.stat().st_size)),
    "zeroed-header": lambda db: db.write_bytes(bytes(100) + db.read_bytes()[100:]),
    "zeroed-page": zero_page,
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_index_is_named_kept_and_rebuilt(kind, treb, treb_home: Path, tmp_path) -> None:
    runs = two_runs(treb, tmp_path)
    assert sorted(runs.values()) == ["FAILED", "SUCCEEDED"]
    db = treb_home / "runs.db"
    treb("ps")  # checkpointed: everything is in runs.db itself
    for extra in ("runs.db-wal", "runs.db-shm"):
        (treb_home / extra).unlink(missing_ok=True)
    DAMAGE[kind](db)
    damaged = db.read_bytes()
    for verb in (["ps"], ["status"], ["status", "--json"], ["logs"], ["diagnose"]):
        clean_error(treb(*verb), "runs.db is damaged", "treb doctor --rebuild-index")
    clean_error(treb("run", str(tmp_path / "w" / "ok.yaml")), "runs.db is damaged")
    assert db.read_bytes() == damaged  # never overwritten, never replaced by an empty store
    res = treb("doctor")
    assert res.returncode == 1 and "FAIL" in res.stdout and "Traceback" not in res.stderr
    res = treb("doctor", "--rebuild-index")
    assert res.returncode == 0, res.stdout + res.stderr
    aside = [p for p in treb_home.glob("runs.db.damaged-*") if not p.name.endswith("-wal")]
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    back = {r["id"]: r["state"] for r in json.loads(treb("ps", "--json").stdout)}
    assert back == runs
    failed = next(rid for rid, state in runs.items() if state == "FAILED")
    st = status_json(treb, failed)
    assert st["first_failure"]["rank"] == 1 and st["first_failure"]["exit_code"] == 3
    assert st["exit_code"] == 3 and [a["state"] for a in st["attempts"]] == ["FAILED"]
    assert sorted(p["rank"] for p in st["procs"]) == [0, 1]
    assert treb("doctor").returncode == 0


def test_missing_index_warns_and_doctor_finds_the_runs(treb, treb_home: Path, tmp_path) -> None:
    runs = two_runs(treb, tmp_path)
    for name in ("runs.db", "runs.db-wal", "runs.db-shm"):
        (treb_home / name).unlink(missing_ok=True)
    res = treb("ps")
    assert res.returncode == 0 and "treb doctor --rebuild-index" in res.stderr
    assert treb("doctor").returncode == 1
    assert treb("doctor", "--rebuild-index").returncode == 0
    assert {r["id"]: r["state"] for r in json.loads(treb("ps", "--json").stdout)} == runs


def test_treb_home_that_is_a_file(treb, treb_home: Path, tmp_path: Path) -> None:
    treb_home.write_text("not a folder\n")
    spec = write_spec(tmp_path / "w", "command: 'true'\n")
    for verb in (["ps"], ["status"], ["run", str(spec)], ["diagnose"]):
        clean_error(treb(*verb), f"TREB_HOME {treb_home} is not a folder")
    assert treb("doctor").returncode == 1


def test_read_only_treb_home(treb, treb_home: Path, tmp_path: Path) -> None:
    two_runs(treb, tmp_path)
    with read_only(treb_home) as view:
        env = {"TREB_HOME": str(view)}
        for verb in (["ps"], ["status"], ["run", str(tmp_path / "w" / "ok.yaml")]):
            clean_error(treb(*verb, env=env), "must be a writable folder")
        clean_error(treb("ps", env={"TREB_HOME": str(view / "new")}), "Read-only file system")
        res = treb("doctor", env=env)
        assert res.returncode == 1 and "not writable" in res.stdout


def test_world_writable_home_and_runs_are_tightened(treb, treb_home: Path, tmp_path) -> None:
    (treb_home / "runs").mkdir(parents=True)
    os.chmod(treb_home, 0o777)
    os.chmod(treb_home / "runs", 0o777)
    res = treb("run", str(write_spec(tmp_path, "command: 'true'\n")))
    assert res.returncode == 0, res.stderr
    assert "had mode 0777 (others could write to it); set it to 0700" in res.stderr
    assert (treb_home.stat().st_mode & 0o777, (treb_home / "runs").stat().st_mode & 0o777) == (
        0o700,
        0o700,
    )
    assert "had mode" not in treb("ps").stderr  # said once, when it was changed


# -- code snapshots ----------------------------------------------------------------------


def test_snapshot_skips_a_fifo_and_includes_untracked_files(treb, tmp_path: Path) -> None:
    work = tmp_path / "w"
    spec = write_spec(work, "command: python train.py\n")
    (work / "train.py").write_text("import helper; print('ran', helper.X)\n")
    (work / "helper.py").write_text("X = 7\n")
    os.mkfifo(work / "pipe")  # opening it to copy it would wait forever for a writer
    res = treb("run", str(spec), timeout=60)
    assert res.returncode == 0, res.stderr
    assert "left out of the code snapshot: pipe (it is a FIFO" in res.stderr
    assert "ran 7" in res.stdout
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "job.yaml"], check=True)
    subprocess.run([*git, "commit", "-qm", "spec only"], check=True)
    res = treb("run", str(spec), timeout=60)  # train.py, helper.py: untracked, not ignored
    assert res.returncode == 0 and "ran 7" in res.stdout, res.stderr
    snap = json.loads((Path(status_json(treb)["run_dir"]) / "snapshot.json").read_text())
    assert snap["untracked"] == ["helper.py", "train.py"] and status_json(treb)["git_dirty"] == 1


def test_snapshot_names_unreadable_files_and_leaves_nothing(treb, treb_home, tmp_path) -> None:
    """Read as user 1000 of a user namespace (root would read anything)."""
    if (
        not shutil.which("unshare")
        or subprocess.run(
            ["unshare", "-U", "--map-user=1000", "true"], capture_output=True
        ).returncode
    ):
        pytest.skip("user namespaces are not available here")
    work = tmp_path / "w"
    spec = write_spec(work, "command: 'true'\n")
    for name in ("a.key", "b.key"):
        (work / name).write_text("secret")
        os.chmod(work / name, 0)
    res = subprocess.run(
        ["unshare", "-U", "--map-user=1000", "--map-group=1000", PY, "-m", "trebuchet", "run",
         str(spec)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    clean_error(res, "cannot read 2 file(s)", "a.key, b.key", "permission denied")
    assert not list((treb_home / "runs").iterdir())  # no run directory without a record
    assert json.loads(treb("ps", "--json").stdout) == []


def test_snapshot_skips_a_file_that_vanishes(tmp_path: Path) -> None:
    from trebuchet.launcher.snapshot import copy_files, list_files

    work = tmp_path / "w"
    work.mkdir()
    for name in ("a.py", "b.py", "c.py"):
        (work / name).write_text(name)
    files, info = list_files(work)
    (work / "b.py").unlink()  # between the listing and the copy
    copy_files(work, files, tmp_path / "code", info)
    assert sorted(p.name for p in (tmp_path / "code").iterdir()) == ["a.py", "c.py"]
    assert info.skipped == {"b.py": "it vanished while the snapshot was taken"}


def test_snapshot_on_a_full_disk_refuses_and_cleans_up(treb, tmp_path: Path) -> None:
    work = tmp_path / "w"
    spec = write_spec(work, "command: 'true'\n")
    (work / "blob.bin").write_bytes(os.urandom(3 << 20))
    with tmpfs(tmp_path / "small", "size=2m") as home:
        res = treb("run", str(spec), env={"TREB_HOME": str(home)})
        clean_error(res, "no room for the code snapshot", "set snapshot: false")
        assert not list((home / "runs").iterdir())
    for i in range(40):  # many small files: the disk has bytes but runs out of inodes
        (work / f"f{i}.py").write_text("x")
    (work / "blob.bin").unlink()
    with tmpfs(tmp_path / "few-inodes", "size=64m,nr_inodes=30") as home:
        res = treb("run", str(spec), env={"TREB_HOME": str(home)})
        clean_error(res, "no space left on device for the code snapshot")
        assert not list((home / "runs").iterdir())
        assert json.loads(treb("ps", "--json", env={"TREB_HOME": str(home)}).stdout) == []


def test_disk_that_fills_mid_run(treb, tmp_path: Path) -> None:
    """The rank's log fills TREB_HOME's disk: the supervisor stops the run, records the
    full disk as the cause (from the space it kept aside) and prints no traceback."""
    from tests.integration.test_faults import assert_no_survivors

    spec = write_spec(
        tmp_path,
        'command: [python, -c, \'import time\n\n  [print("x" * 1000, flush=True) for _ in '
        "range(5000)]\n\n  time.sleep(60)']\nsnapshot: false\n",
    )
    with tmpfs(tmp_path / "full", "size=2m") as home:
        env = {"TREB_HOME": str(home)}
        res = treb("run", str(spec), env=env, timeout=120)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        assert "stopped: no space left on device" in res.stderr
        st = json.loads(treb("status", "--json", env=env).stdout)
        assert st["state"] == "FAILED" and st["first_failure"]["label"] == "disk"
        assert st["diagnosis"]["root_cause"]["category"] == "disk_full"
        assert_no_survivors(st["id"])


def test_diagnosis_says_why_a_file_is_not_in_the_snapshot(treb, tmp_path: Path) -> None:
    work = tmp_path / "w"
    spec = write_spec(work, "command: python gen_train.py\n")
    (work / ".gitignore").write_text("gen_*.py\n")
    (work / "gen_train.py").write_text("print('hi')\n")
    subprocess.run(["git", "-C", str(work), "init", "-q"], check=True)
    res = treb("run", str(spec))
    assert res.returncode == 1
    assert "cause: missing_file on rank 0" in res.stderr
    assert "gen_train.py is in the workdir but not in the code snapshot: git ignores it " in (
        res.stderr
    )
    assert ".gitignore:1:gen_*.py" in res.stderr
