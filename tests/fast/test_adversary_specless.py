"""The adversary's second pass on the spec-less `treb run SCRIPT` (issue 33, Low: a script
outside this folder): the script is judged by where it really is, so a symlink in this
folder that leads out of it is a script outside it too."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from trebuchet.cli import specless
from trebuchet.errors import UserError


def _tree(tmp_path: Path) -> Path:
    """here/link.py -> ../other/train.py, here/sub -> ../other (relative links: the run's
    copy of `here` keeps them as they are, leading nowhere)."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "train.py").write_text("print('ran ok')\n")
    here = tmp_path / "here"
    here.mkdir()
    (here / "link.py").symlink_to("../other/train.py")
    (here / "sub").symlink_to("../other")
    return here


@pytest.mark.parametrize("script", ["link.py", "sub/train.py"])
def test_a_symlink_out_of_the_folder_runs_the_script_it_leads_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, treb, script: str
) -> None:
    here = _tree(tmp_path)
    monkeypatch.chdir(here)
    res = treb("run", script, cwd=here, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ran ok" in res.stdout + res.stderr
    assert "is outside this folder" in res.stderr


@pytest.mark.parametrize("script", ["link.py", "sub/train.py"])
def test_a_symlink_out_of_the_folder_is_refused_where_the_folder_travels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    monkeypatch.chdir(_tree(tmp_path))
    args = argparse.Namespace(command=[script], no_python=False, on="ssh")
    with pytest.raises(UserError, match="is outside this folder"):
        specless.build(args)


def test_a_symlink_inside_the_folder_stays_as_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = _tree(tmp_path)
    (here / "real.py").write_text("")
    (here / "alias.py").symlink_to("real.py")
    monkeypatch.chdir(here)
    args = argparse.Namespace(command=["alias.py", "-x"], no_python=False, on="ssh")
    assert specless.build(args)["command"] == ["python", "alias.py", "-x"]
