"""What a rank prints cannot break a view (issue 33): a real local run whose rank 0 prints
metric names no terminal or SQLite takes (a lone surrogate, ESC/OSC, NUL, C1, U+2028,
rich markup) between normal points. Every view exits 0 while the run is active and after
it ended, with no traceback, shows `loss`, and writes text a terminal shows as text."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TrebFn

RANK = r"""
import os, sys, time
lines = [
    r'{"step": 1, "loss": 0.9}',
    r'{"step": 2, "\ud800": 1, "acc": 0.1}',
    r'{"step": 3, "loss": 0.5, "e\u001b]0;TITLE\u0007sc": 2, "n\u0000ul": 3}',
    r'{"step": 4, "c1\u009b2J": 4, "ls\u2028x": 5, "[/]": 6, "[bold]b": 7, "t\tab\nnl": 8}',
]
for line in lines:
    print(line, flush=True)
sys.stdout.buffer.write(b"\x1b]0;TITLE\x07 done \xed\xa0\x80\n")
sys.stdout.flush()
end = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < end:
    time.sleep(0.05)
"""

VIEWS = [["ps"], ["ps", "--all"], ["status"], ["top"], ["results"], ["metrics"]]
RUN_VIEWS = [["status"], ["metrics"], ["metrics", "--json"], ["metrics", "--csv"],
             ["status", "--json"], ["diagnose"], ["logs"], ["logs", "--dedup"]]  # fmt: skip
# What a terminal would act on: C0 but \n (and \t in logs), DEL, C1, and the line and
# paragraph separators; a surrogate cannot be encoded at all.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _treb(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          timeout=120, env=env)  # fmt: skip


def _shown(res: subprocess.CompletedProcess[bytes], what: str) -> str:
    """The view's stdout, checked: exit 0, no traceback, text a terminal shows as text
    (UTF-8); `logs` into a pipe writes the log as it was written (_on_tty: to a terminal)."""
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 0, f"{what}: exit {res.returncode}: {err[-2000:]}"
    assert "Traceback" not in err, f"{what}: {err[-2000:]}"
    if what.startswith("logs"):  # one rank's log into a pipe: as written
        return res.stdout.decode(errors="replace")
    out = res.stdout.decode("utf-8")
    for stream in (out, res.stderr.decode("utf-8")):
        raw = RAW.findall(stream.replace("\t", " ").replace("\r\n", "\n"))  # CSV: \r\n
        assert not raw, f"{what}: raw control characters {raw!r} in {stream[-1500:]!r}"
    return out


def _on_tty(*args: str) -> bytes:
    """What `treb ARGS` writes to a terminal (a pty)."""
    import pty

    master, slave = pty.openpty()
    try:
        res = subprocess.run([sys.executable, "-m", "trebuchet", *args], stdout=slave,
                             stderr=subprocess.PIPE, timeout=120)  # fmt: skip
        os.close(slave)
        assert res.returncode == 0, res.stderr
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed and drained
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(master)


def _views(run_id: str) -> dict[str, str]:
    out = {}
    for args in VIEWS:
        out[" ".join(args)] = _shown(_treb(*args), " ".join(args))
    for args in RUN_VIEWS:
        what = f"{args[0]} RUN {' '.join(args[1:])}"
        out[what] = _shown(_treb(args[0], run_id, *args[1:]), what)
    # one rank's log: into a pipe as written, on a terminal with ESC and BEL shown as text
    tty = _on_tty("logs", run_id)
    assert b"^[]0;TITLE^G done" in tty and b"\x1b" not in tty and b"\x07" not in tty, tty
    return out


def _loss(metrics_json: str) -> list[list[float]]:
    return json.loads(metrics_json)["metrics"]["loss"]["points"]


def test_hostile_metric_names_break_no_view(treb: TrebFn, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    go = tmp_path / "go"
    res = treb("run", "-d", "--", "python", str(script), str(go), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    run_id = _treb("ps", "-q").stdout.decode().split()[0]
    run_dir = Path(os.environ["TREB_HOME"]) / "runs" / run_id
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the agent wrote the 4th point
            files = list(run_dir.glob("attempt-*/metrics/rank-0.jsonl"))
            if files and b'"s": 4' in files[0].read_bytes():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the rank's points were not written")
        active = _views(run_id)
        assert run_id in active["ps"] and "RUNNING" in active["ps"]
        assert "  metrics: " in active["top"], active["top"]  # the 4 newest: shown as text
        go.touch()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = json.loads(_treb("ps", "--json", "--all").stdout)[0]["state"]
            if state == "SUCCEEDED":
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the run did not end: {state}")
        ended = _views(run_id)
    finally:
        go.touch()
        _treb("cancel", run_id)
    for views in (active, ended):
        assert (
            _loss(views["metrics RUN --json"]) and _loss(views["metrics RUN --json"])[-1][1] == 0.5
        )
        assert re.search(r"(?m)^loss\s+0\.5\s", views["metrics RUN "]), views["metrics RUN "]
        names = set(json.loads(views["metrics RUN --json"])["metrics"])
        # every name kept, each shown as text (the chunk's other metrics are not lost)
        assert {"loss", "acc", "[/]", "[bold]b"} <= names, names
        assert len(names) == 10, names
        assert "\x1b]0;TITLE\x07 done" in views["logs RUN "]  # a pipe: the bytes written
    assert "\\ud800" in ended["metrics RUN "] and "e^[]0;TITLE^Gsc" in ended["metrics RUN "]


ESCAPES = r"""
print(r'{"step": 1, "loss": 0.5, "n\u0000ul": 1, "o\u001b]0;TITLE\u0007sc": 2, "e\u001b[2Jx": 3}')
"""


def test_metric_names_are_shown_as_text(treb: TrebFn, tmp_path: Path) -> None:
    """Issue 33 (low): `treb metrics` printed names raw (NUL, OSC, ESC)."""
    script = tmp_path / "rank.py"
    script.write_text(ESCAPES)
    res = treb("run", "--", "python", str(script), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = _shown(_treb("metrics"), "metrics")
    for name in ("n^@ul", "o^[]0;TITLE^Gsc", "e^[[2Jx"):
        assert re.search(rf"(?m)^{re.escape(name)}\s", out), out
    assert re.search(r"(?m)^loss\s+0\.5\s", out), out
    _shown(_treb("metrics", "--csv"), "metrics --csv")
