"""launcher/outputs.py: which files in a code snapshot the run wrote, and where a spec-less
launch runs. Real folders and files; hostile names are normal input."""

from __future__ import annotations

import json
import os
from pathlib import Path

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
