"""The terminal view of many rank logs: whole lines, prefixed, \\r progress bars split."""

from __future__ import annotations

import io
from pathlib import Path

from trebuchet.launcher.follow import Follower


def _follower(tmp_path: Path, names: list[str]) -> tuple[Follower, io.BytesIO, dict[str, Path]]:
    out = io.BytesIO()
    f = Follower(out)
    paths = {}
    for n in names:
        paths[n] = tmp_path / f"{n}.log"
        f.add(n, paths[n])
    return f, out, paths


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def test_partial_lines_do_not_interleave(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["0:0", "0:1"])
    _append(p["0:0"], b"hello wo")
    _append(p["0:1"], b"second rank line\n")
    f.pump()
    _append(p["0:0"], b"rld\n")
    f.pump()
    assert out.getvalue().decode().splitlines() == ["[0:1] second rank line", "[0:0] hello world"]


def test_carriage_return_progress_bars(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["1:0", "1:1"])
    _append(p["1:0"], b"10%\r50%\r100%\n")
    _append(p["1:1"], b"line\r\n")
    f.close()
    assert out.getvalue().decode().splitlines() == [
        "[1:0] 10%",
        "[1:0] 50%",
        "[1:0] 100%",
        "[1:1] line",
    ]


def test_unterminated_last_line_is_flushed_on_close(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["0"])
    _append(p["0"], b"no newline")
    f.pump()
    assert out.getvalue() == b""
    f.close()
    assert out.getvalue() == b"[0] no newline\n"


def test_tail_lines(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    out = io.BytesIO()
    f = Follower(out)
    f.add("0:0", path, tail_lines=3)
    f.close()
    assert out.getvalue().decode().splitlines() == [
        "[0:0] line 97",
        "[0:0] line 98",
        "[0:0] line 99",
    ]


def test_files_appearing_later_are_picked_up(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["0:0"])
    f.pump()
    _append(p["0:0"], b"late\n")
    f.pump()
    assert out.getvalue() == b"[0:0] late\n"
