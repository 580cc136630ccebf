"""Snapshot paths in tracebacks read as the user's files, while those are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from trebuchet.diagnose.codepaths import CodeMap


def test_maps_unchanged_files_only(tmp_path: Path) -> None:
    run, src = tmp_path / "runs" / "abcd0001", tmp_path / "my proj"
    (run / "code" / "pkg").mkdir(parents=True)
    (src / "pkg").mkdir(parents=True)
    for rel, text in (("train.py", "a\n"), ("pkg/m.py", "b\n")):
        (run / "code" / rel).write_text(text)
        (src / rel).write_text(text)
    (src / "pkg" / "m.py").write_text("edited\n")
    (run / "snapshot.json").write_text(json.dumps({"path": str(run / "code"), "source": str(src)}))
    code = CodeMap.for_run(run)
    assert code is not None
    line = f'  File "{run}/code/train.py", line 6, in main; {run}/code/pkg/m.py:3'
    assert code.text(line) == f'  File "{src}/train.py", line 6, in main; {run}/code/pkg/m.py:3'
    assert code.changed == ["pkg/m.py"]
    assert code.text(f"{run}/code/gone.py:1") == f"{run}/code/gone.py:1"  # not in the workdir
    assert code.text("no paths here") == "no paths here"
    assert CodeMap.for_run(tmp_path / "nowhere") is None
    (run / "snapshot.json").write_text("{not json")
    assert CodeMap.for_run(run) is None
