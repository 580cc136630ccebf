"""launcher/outputs.py: which files in a code snapshot the run wrote, and where a spec-less
launch runs. Real folders and files; hostile names are normal input."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.launcher import outputs
from trebuchet.runtime.watch.display_lines import shown


def snapshot_run(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """A run directory whose code/ holds `files`, with its snapshot.json and manifest."""
    run, code = tmp_path / "run", tmp_path / "run" / "code"
    code.mkdir(parents=True)
    for rel, text in files.items():
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(text)
    (run / "snapshot.json").write_text(json.dumps({"path": str(code), "source": "/home/me/p"}))
    (run / outputs.MANIFEST).write_text(json.dumps(outputs.manifest(code)))
    return run, code


def test_new_and_changed_files_are_told_apart_from_the_snapshot(tmp_path: Path) -> None:
    run, code = snapshot_run(tmp_path, {"train.py": "x", "conf/a.yaml": "a: 1"})
    (code / "out.txt").write_text("result")
    (code / "ckpt").mkdir()
    (code / "ckpt" / "1.pt").write_text("w")
    (code / "ckpt" / "2.pt").write_text("w")
    (code / "conf" / "a.yaml").write_text("a: 22")  # rewritten by the run
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_text("bytecode")
    found = outputs.written(run)
    assert found is not None
    assert found["new"] == ["ckpt/1.pt", "ckpt/2.pt", "out.txt"]
    assert found["changed"] == ["conf/a.yaml"] and found["count"] == 4
    assert outputs.lines(run) == [
        "outputs: 4 file(s) written by relative path are in the code snapshot the ranks ran "
        "in, not in /home/me/p (`snapshot: false` runs in the workdir itself):",
        f"  {code}/ckpt/ (2 files)",
        f"  {code}/conf/ (1 file)",
        f"  {code}/out.txt",
    ]


def test_nothing_written_or_no_snapshot_says_nothing(tmp_path: Path) -> None:
    run, _ = snapshot_run(tmp_path, {"train.py": "x"})
    assert outputs.lines(run) == []
    assert outputs.written(tmp_path / "elsewhere") is None  # no snapshot.json
    (run / outputs.MANIFEST).unlink()  # a run from before the manifest
    assert outputs.written(run) is None


def test_a_symlink_the_run_made_is_listed_not_followed(tmp_path: Path) -> None:
    run, code = snapshot_run(tmp_path, {"train.py": "x"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_text("not the run's")
    os.symlink(outside, code / "data")
    found = outputs.written(run)
    assert found is not None and found["new"] == ["data"]


def test_over_ssh_without_a_shared_run_dir_each_hosts_copy_is_named(tmp_path: Path) -> None:
    run, _ = snapshot_run(tmp_path, {"train.py": "x"})
    (run / "ssh.json").write_text(json.dumps({
        "remote_root": ".treb-runs", "remote_run_dir": ".treb-runs/abc", "hosts": ["h1", "h2", "spare"],
        "nodes": 2}))  # fmt: skip
    assert outputs.lines(run)[0].endswith("h1:.treb-runs/abc/code, h2:.treb-runs/abc/code")


def test_a_spec_less_launch_runs_in_place_where_the_nodes_see_the_folder() -> None:
    assert outputs.in_place("local", "/tmp/x") == {"snapshot": False}
    assert outputs.in_place(None, "/home/me/p") == {"snapshot": False}
    assert outputs.in_place("slurm", "/home/me/p") == {"snapshot": False}
    for local_disk in ("/tmp", "/tmp/x", "/var/tmp/x", "/dev/shm/p"):
        assert outputs.in_place("slurm", local_disk) == {}  # the snapshot in TREB_HOME stays
    assert outputs.in_place("slurm", "/tmpfoo/p") == {"snapshot": False}
    for shipped in ("ssh", "kubernetes", "skypilot"):
        assert outputs.in_place(shipped, "/home/me/p") == {}


NAMES = st.text(
    alphabet=st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
    min_size=1, max_size=20,
).filter(lambda n: n not in (".", "..", "__pycache__"))  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(names=st.lists(NAMES, min_size=1, max_size=5, unique=True))
def test_any_file_name_is_found_and_shown_on_one_line(tmp_path_factory, names: list[str]) -> None:
    """ESC, newlines, U+2028 in a name a rank wrote: listed as it is, shown (as status and
    the summary print the lines) on one line each, without a control character."""
    tmp = tmp_path_factory.mktemp("o")
    run, code = snapshot_run(tmp, {"train.py": "x"})
    made = []
    for n in names:
        try:
            (code / n).write_text("o")
        except (OSError, UnicodeEncodeError):
            continue
        made.append(n)
    found = outputs.written(run)
    assert found is not None and sorted(found["new"]) == sorted(made)
    for line in outputs.lines(run):
        text = shown(line)
        assert "\n" not in text and "\x1b" not in text and "\u2028" not in text


def test_a_tree_deeper_than_the_recursion_limit_never_crashes_the_listing(tmp_path: Path) -> None:
    """A rank that nests 1200 folders (os.walk recursed, and `treb status` died of a
    RecursionError traceback)."""
    run, code = snapshot_run(tmp_path, {"train.py": "x"})
    here = os.getcwd()
    try:
        os.chdir(code)
        for _ in range(1200):
            os.mkdir("a")
            os.chdir("a")
        Path("deep.txt").write_text("x")
    finally:
        os.chdir(here)
    try:
        found = outputs.written(run)
        assert found is not None and found["count"] == 1
        assert found["new"][0].endswith("/a/deep.txt")
        assert outputs.lines(run)[1] == f"  {code}/a/ (1 file)"
    finally:  # pytest's own rmtree recurses too
        unnest(code / "a")


def unnest(top: Path) -> None:
    """Remove a chain of nested folders `a/a/a/...` without recursion."""
    here = os.getcwd()
    depth = 0
    try:
        os.chdir(top)
        while os.path.isdir("a"):
            os.chdir("a")
            depth += 1
        for name in os.listdir("."):
            os.unlink(name)
        for _ in range(depth):
            os.chdir("..")
            os.rmdir("a")
    finally:
        os.chdir(here)
    top.rmdir()


def test_empty_folders_count_toward_the_walk_bound(tmp_path: Path, monkeypatch: Any) -> None:
    """Folders are entries too: a rank that makes a million empty folders must not make the
    summary or `treb status` walk them all (only files were counted)."""
    run, code = snapshot_run(tmp_path, {"train.py": "x"})
    for i in range(60):
        (code / f"empty{i:03}").mkdir()
    monkeypatch.setattr(outputs, "MAX_WALKED", 30)
    found = outputs.written(run)
    assert found is not None and found["truncated"] is True
    assert outputs.lines(run)[-1].endswith(f"too many entries to look through: `ls {code}`")


def test_a_forged_snapshot_path_never_lists_outside_the_run(tmp_path: Path) -> None:
    """snapshot.json sits where a rank can write: its `path` pointing at another folder
    (or being no string) must not make treb list (or crash on) that folder."""
    run, code = snapshot_run(tmp_path, {"train.py": "x"})
    (code / "out.txt").write_text("mine")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    for forged in (str(outside), "/", 123, ["x"]):
        (run / "snapshot.json").write_text(json.dumps({"path": forged, "source": "/p"}))
        found = outputs.written(run)
        assert found is not None and found["new"] == ["out.txt"], forged
        assert found["dir"] == str(code)


def test_a_huge_forged_manifest_is_not_read_whole(tmp_path: Path) -> None:
    """A rank replaces snapshot-files.json by a 1 GiB file: the listing reads a bounded
    prefix (it was read whole into memory)."""
    import tracemalloc

    run, _ = snapshot_run(tmp_path, {"train.py": "x"})
    with open(run / outputs.MANIFEST, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: no disk used
    tracemalloc.start()
    try:
        outputs.lines(run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20


@settings(max_examples=150, deadline=None)
@given(
    snap=st.one_of(st.text(), st.dictionaries(st.text(max_size=8), st.from_type(object))),
    manifest=st.text(max_size=200),
    ssh=st.text(max_size=200),
)
def test_any_run_directory_records_never_crash_the_listing(
    tmp_path_factory: Any, snap: Any, manifest: str, ssh: str
) -> None:
    """snapshot.json, snapshot-files.json and ssh.json as a rank may leave them (any text,
    NaN, 1e999, huge ints, wrong types): lines() and written() answer, never raise."""
    run, _ = snapshot_run(tmp_path_factory.mktemp("r"), {"train.py": "x"})
    for name, text in (("snapshot.json", snap), (outputs.MANIFEST, manifest), ("ssh.json", ssh)):
        if not isinstance(text, str):
            text = json.dumps(text, default=repr)
        (run / name).write_text(text, errors="surrogateescape")
    outputs.lines(run)
    json.dumps(outputs.written(run))


@settings(max_examples=100, deadline=None)
@given(
    ssh=st.fixed_dictionaries(
        {
            "remote_root": st.one_of(st.text(), st.integers(), st.none(), st.floats()),
            "remote_run_dir": st.one_of(st.text(), st.integers(), st.floats(), st.lists(st.text())),
            "hosts": st.one_of(st.text(), st.integers(), st.lists(st.text()), st.none()),
            "nodes": st.one_of(st.text(), st.integers(), st.floats(), st.none()),
        }
    )
)
def test_a_forged_ssh_record_never_crashes_the_listing(tmp_path_factory: Any, ssh: Any) -> None:
    """ssh.json's fields of any type (NaN, 1e999, "abc" nodes, a number for a path)."""
    run, _ = snapshot_run(tmp_path_factory.mktemp("r"), {"train.py": "x"})
    (run / "ssh.json").write_text(json.dumps(ssh))
    for line in outputs.lines(run):  # the views make each line safe with shown()
        assert "\n" not in shown(line)
    json.dumps(outputs.written(run))


def test_a_rerun_copies_only_the_snapshots_own_files_whatever_the_manifest_says(
    tmp_path: Path,
) -> None:
    """snapshot-files.json forged by a rank: names with `..`, absolute ones, and one through
    a symlink the rank made to a folder outside. A rerun's copy (snapshot.reuse) takes only
    files inside the earlier code/ and writes only inside its own."""
    from trebuchet.launcher.snapshot import reuse

    run, code = snapshot_run(tmp_path, {"train.py": "x"})
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "key").write_text("private")
    (run / "notes.txt").write_text("the earlier run's own file")
    (code / "link").symlink_to(secret)
    forged = {"train.py": [1, 1], "../notes.txt": [1, 1], str(secret / "key"): [1, 1],
              "link/key": [1, 1], "": [0, 0], "./../notes.txt": [1, 1]}  # fmt: skip
    (run / outputs.MANIFEST).write_text(json.dumps(forged))
    new = tmp_path / "new"
    new.mkdir()
    reuse(run, new / "code")
    assert sorted(os.listdir(new)) == ["code"]  # nothing written beside the copy
    assert sorted(os.listdir(new / "code")) == ["train.py"]
