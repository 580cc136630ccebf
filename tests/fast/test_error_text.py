"""treb's own errors quote what a user typed or a program wrote (a file name, an argument,
a log line): a terminal shows it as text, never obeys it."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import TrebFn


def test_an_error_quoting_a_typed_name_shows_its_escapes_as_text(
    treb: TrebFn, tmp_path: Path
) -> None:
    name = "no\x1b]0;TITLE\x07such\x1b[2J.py"
    res = treb("run", "-n", "1", name, cwd=tmp_path)
    assert res.returncode == 2
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert "no^[]0;TITLE^Gsuch^[[2J.py" in res.stderr
    assert "Traceback" not in res.stderr
