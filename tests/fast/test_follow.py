"""The terminal view of many rank logs: whole lines, prefixed, \\r progress bars split,
linear in the input, bounded, inert, and apart from supervision."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

from trebuchet.runtime.watch.display_lines import CAP, CUT, inert
from trebuchet.view.follow import KEEP_TAIL, Follower
from trebuchet.view.live import View


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


# -- bounded, linear, inert ---------------------------------------------------------------


class Counting:
    """A sink that keeps only what the tests look at: each write's lines and their sizes."""

    def __init__(self) -> None:
        self.lines = 0
        self.payload = 0
        self.longest = 0
        self.cut = 0

    def write(self, data: bytes) -> int:
        for line in data.split(b"\n")[:-1]:
            body = line.removeprefix(b"[0] ")
            self.lines += 1
            self.cut += body.endswith(CUT)
            body = body.removesuffix(CUT)
            self.payload += len(body)
            self.longest = max(self.longest, len(body))
        return len(data)

    def flush(self) -> None:
        pass


def test_newline_less_flood_is_split_in_linear_work_and_bounded_pieces(tmp_path: Path) -> None:
    # 64 MB without a newline: the old splitter re-scanned the whole partial line on every
    # read (quadratic: this test would not end). Now every byte is searched once, and the
    # view holds at most CAP bytes of it, emitting full pieces as they come.
    size = 64 << 20
    path = tmp_path / "flood.log"
    with open(path, "wb") as fh:
        for _ in range(size >> 20):
            fh.write(b"x" * (1 << 20))
    sink = Counting()
    f = Follower(sink)
    f.add("0", path)
    f.pump()
    tail = f.tails[path]
    assert tail.lines.searched == size
    assert tail.lines.partial_len <= CAP
    assert sink.cut == sink.lines == size // CAP - 1  # the last piece waits for its line end
    f.close()
    assert (sink.lines, sink.cut, sink.payload, sink.longest) == (size // CAP, size // CAP - 1,
                                                                  size, CAP)  # fmt: skip


def test_long_lines_go_out_in_marked_pieces(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["0"])
    _append(p["0"], b"a" * (CAP + 10))  # a partial line over the cap: one piece out now
    f.pump()
    assert out.getvalue() == b"[0] " + b"a" * CAP + CUT + b"\n"
    _append(p["0"], b"b\n" + b"c" * (2 * CAP + 1) + b"\nd\n")
    f.close()
    assert out.getvalue().split(b"\n") == [
        b"[0] " + b"a" * CAP + CUT,
        b"[0] " + b"a" * 10 + b"b",
        b"[0] " + b"c" * CAP + CUT,
        b"[0] " + b"c" * CAP + CUT,
        b"[0] c",
        b"[0] d",
        b"",
    ]


def test_escape_sequences_are_made_visible(tmp_path: Path) -> None:
    f, out, p = _follower(tmp_path, ["0"])
    _append(p["0"], b"\x1b[2J\x1b[H cleared\n\x1b]0;owned\x07 title\n"
                    b"\xc2\x9b31m c1 csi\tkept tab\x08\x7f\n\xc3\xa9t\xc3\xa9\n")  # fmt: skip
    f.close()
    assert out.getvalue().decode().splitlines() == [
        "[0] ^[[2J^[[H cleared",
        "[0] ^[]0;owned^G title",
        "[0] M-^[31m c1 csi\tkept tab^H^?",
        "[0] été",
    ]
    assert inert(bytes(range(32))) == b"".join(
        b"^" + bytes([c + 64]) if c not in (9, 10, 13) else bytes([c]) for c in range(32)
    )


def test_a_log_far_ahead_of_the_view_is_skipped_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "rank-3.log"
    text = b"".join(b"line %07d\n" % i for i in range(500_000))  # 6.5 MB
    path.write_bytes(text)
    out = io.BytesIO()
    f = Follower(out, skip_over=1 << 20)
    f.add("0:3", path)
    f.close()
    lines = out.getvalue().decode().splitlines()
    shown = len(lines) - 1
    skipped = len(text) - shown * len(b"line 0000000\n")
    assert lines[0] == (
        f"[0:3] [treb: view skipped {skipped / 1e6:.1f} MB of this output; "
        "`treb logs` has all of it]"
    )
    assert lines[1:] == [f"[0:3] line {i:07d}" for i in range(500_000 - shown, 500_000)]
    assert shown * 13 <= KEEP_TAIL  # only the end is shown
    assert path.read_bytes() == text  # the log itself is never touched


# -- the view beside supervision ----------------------------------------------------------


def test_view_says_after_the_output_so_far_and_drains_on_close(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"first\n")
    out = io.BytesIO()
    view = View(out, out)  # one stream, so the order of lines and messages shows
    view.add("0:0", log)
    view.say("attempt 0 FAILED; retrying \x1b[2J")
    deadline = time.monotonic() + 60
    while b"treb: " not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)  # wait for the message, so that what follows comes after it
    _append(log, b"last\nno newline")
    view.close()
    assert out.getvalue().decode().splitlines() == [
        "[0:0] first",
        "treb: attempt 0 FAILED; retrying ^[[2J",
        "[0:0] last",
        "[0:0] no newline",
    ]


class Stalled:
    """A terminal that stopped reading: every write blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, data: bytes) -> int:
        self.entered.set()
        self.release.wait()
        return len(data)

    def flush(self) -> None:
        pass


def test_a_stalled_terminal_blocks_neither_add_nor_say_nor_close(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"x\n")
    out = Stalled()
    view = View(out, out)
    try:
        view.add("0:0", log)
        assert out.entered.wait(60)  # the view thread is now stuck in a write
        for i in range(1000):
            view.add(f"0:{i}", tmp_path / f"rank-{i}.log")
            view.say("still here")
        view.close(drain_timeout=0.2)  # returns (else this test hangs) with the thread stuck
        assert view.follower.stop
    finally:
        out.release.set()


def test_live_view_shows_the_latest_state_of_a_progress_bar(tmp_path: Path) -> None:
    """The attached view (redraw): a 1,000-step \\r bar is a few lines, not 1,000; \\r\\n is
    a plain line end; the file keeps every state (it is only read)."""
    log = tmp_path / "rank-0.log"
    bar = b"".join(b"\r%4d/1000 |%s|" % (i, b"#" * (i // 50)) for i in range(1, 1001))
    log.write_bytes(b"epoch 0\n" + bar + b"\ndone\r\n")
    out = io.BytesIO()
    view = View(out, out)
    view.add("0:0", log)
    view.close()
    lines = out.getvalue().decode().splitlines()
    assert lines == ["[0:0] epoch 0", "[0:0] 1000/1000 |" + "#" * 20 + "|", "[0:0] done"]
    assert log.read_bytes().count(b"\r") == 1001


def test_live_view_bar_in_progress_shows_its_latest_state_when_stale(tmp_path: Path) -> None:
    f = Follower(io.BytesIO(), redraw=True)
    out = f.out
    log = tmp_path / "rank-0.log"
    f.add("0:0", log)
    _append(log, b"\r10%\r20%\r30%")
    f.pump()
    assert out.getvalue() == b""  # pending: a state is shown when the line ends or goes stale
    t = f.tails[log]
    t.partial_since -= 2  # as if a second had passed
    f.pump()
    assert out.getvalue() == b"[0:0] 30%\n"
    _append(log, b"\r40%\r50%\n")
    f.close()
    assert out.getvalue().decode().splitlines() == ["[0:0] 30%", "[0:0] 50%"]
