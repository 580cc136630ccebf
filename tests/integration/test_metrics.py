"""Metrics and `treb top` on real runs: digits-ddp's loss and accuracy as the rank printed
them (native and torchrun), per-rank metrics on request, `treb top` plain and in a pty
(q quits, the terminal is given back), `treb results --metric`."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, status_json

pytestmark = pytest.mark.integration
DIGITS = REPO / "examples" / "digits-ddp" / "job.yaml"
TICKER = """\
import json, os, sys, time
rank = int(os.environ["RANK"])
for i in range(int(sys.argv[1])):
    print(json.dumps({"step": i, "loss": 1 / (i + 1) + rank}), flush=True)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("launcher", ["native", "torchrun"])
def test_digits_ddp_loss_and_accuracy_are_metrics(launcher: str, treb) -> None:
    needs("torch")
    needs("sklearn")
    res = treb("run", str(DIGITS), "-o", f"launcher={launcher}",
               "-o", "command=python train.py --epochs 6", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    printed = {int(e): float(v) for e, v in re.findall(r"^\[0:0\] epoch (\d+) loss ([0-9.]+)$",
                                                       res.stdout, re.M)}  # fmt: skip
    accuracy = float(re.search(r"^\[0:0\] accuracy: ([0-9.]+)$", res.stdout, re.M)[1])
    perf = float(re.search(r"^\[0:0\] performance: ([0-9.]+) samples_per_second", res.stdout,
                           re.M)[1])  # fmt: skip
    assert sorted(printed) == [1, 2, 3, 4, 5, 6]
    assert "  metrics: accuracy" in res.stderr  # the attached run's summary names them
    got = json.loads(treb("metrics", "--json").stdout)["metrics"]
    assert {int(s): v for s, v, _ in got["loss"]["points"]} == printed
    assert got["accuracy"]["last"]["value"] == accuracy
    assert got["accuracy"]["last"]["step"] == 6  # after the last epoch line
    assert got["samples_per_second"]["last"]["value"] == perf
    table = treb("metrics").stdout
    assert re.search(rf"^loss\s+{printed[6]}\s+6\s+6\s", table, re.M), table
    csv_out = treb("metrics", "loss", "--csv").stdout.splitlines()
    assert csv_out[0] == "run_id,name,step,value,time" and len(csv_out) == 7


def test_every_rank_on_request_and_treb_top_plain(treb, tmp_path: Path) -> None:
    (tmp_path / "tick.py").write_text(TICKER)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: ticker\ncommand: python tick.py 40\nprocs_per_node: 3\nsnapshot: false\n"
        "metrics: {ranks: all}\n"
    )
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    for rank in range(3):
        got = json.loads(treb("metrics", "--rank", str(rank), "--json").stdout)["metrics"]
        assert got["loss"]["last"] == {**got["loss"]["last"], "step": 39, "value": 1 / 40 + rank}
        assert len(got["loss"]["points"]) == 40
    top = treb("top", "--all")  # stdout is a pipe: one plain snapshot
    assert top.returncode == 0
    rid = status_json(treb)["id"]
    assert re.search(rf"^{rid}  ticker  local  SUCCEEDED  attempt 1/1  1x3", top.stdout, re.M)
    assert "metrics: loss 0.025 @39" in top.stdout
    assert "node 0: 0 exit 0, 1 exit 0, 2 exit 0" in top.stdout
    first = rid
    assert treb("run", str(spec), "-o", "command=python tick.py 20").returncode == 0
    second = status_json(treb)["id"]
    res = treb("results", first, second, "-m", "loss")
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith(second))
    assert row.split()[-1] == "0.05"  # its last loss, in the LOSS column
    assert f"change: +100.00% loss ({second} vs {first})" in res.stdout


def top_in_a_pty(env: dict[str, str]) -> tuple[int, int]:
    """`treb top -n 0.5` on a new terminal, as an interactive shell would start it: with
    the default SIGINT and SIGQUIT even where the suite inherited them ignored (a shell
    running it in the background without job control: Python keeps an ignored SIGINT, and
    Ctrl+C would then do nothing)."""
    pid, fd = pty.fork()
    if pid == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        os.execvpe(sys.executable, [sys.executable, "-m", "trebuchet", "top", "-n", "0.5"],
                   {**os.environ, **env})  # fmt: skip
    return pid, fd


def wait_exit(pid: int, fd: int, timeout: float) -> int:
    """The child's wait status, reading its terminal meanwhile (a full terminal would block
    its writes); fails after `timeout` instead of hanging the suite."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        read_until(fd, b"\0never", 0.2)
    raise AssertionError(
        f"treb top (pid {pid}) still running {timeout:g} s after it was told to quit"
    )


def read_until(fd: int, pattern: bytes, timeout: float) -> bytes:
    seen = b""
    end = time.monotonic() + timeout
    while pattern not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_treb_top_live_in_a_pty_quits_on_q(treb, tmp_path: Path) -> None:
    (tmp_path / "tick.py").write_text(TICKER)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: ticker\ncommand: python tick.py 2000\nsnapshot: false\n")
    res = treb("run", "--detach", str(spec))
    assert res.returncode == 0, res.stderr
    rid = res.stdout.split()[0]
    pid, fd = top_in_a_pty({"COLUMNS": "160", "LINES": "40", "TERM": "xterm"})
    try:
        screen = read_until(fd, b"loss", 60)
        assert rid.encode() in screen and b"RUNNING" in screen, screen[-2000:]
        assert b"\x1b[?1049h" in screen  # the alternate screen
        os.write(fd, b"q")
        tail = read_until(fd, b"\x1b[?1049l", 20)
        assert b"\x1b[?1049l" in tail  # left the alternate screen
        status = wait_exit(pid, fd, 20)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
        subprocess.run([sys.executable, "-m", "trebuchet", "cancel", rid], capture_output=True,
                       timeout=60)  # fmt: skip


def test_treb_top_live_quits_on_ctrl_c(treb) -> None:
    pid, fd = top_in_a_pty({"TERM": "xterm"})
    try:
        assert b"no active runs" in read_until(fd, b"no active runs", 60)
        os.write(fd, b"\x03")  # the terminal's interrupt character: SIGINT to top
        read_until(fd, b"\x1b[?1049l", 20)
        status = wait_exit(pid, fd, 20)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
