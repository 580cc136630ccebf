"""Flooding output: the attached terminal view must never slow or delay supervision.

Three cases, alternated over `--rounds` rounds (medians reported):
  (a) `--ranks` ranks print `--mb` MB of 100-byte lines in total (one print() each, or in
      0.8 MB writes with `--writes blocks`): the run's span (launch -> `ended_at` in the
      store) attached vs detached, target attached <= 1.2x; also the attached `treb run`'s
      wall time, which adds the final summary (it reads every log for results).
  (b) one rank writes 64 MB without a newline under `timeout: 3s` (ignoring the warning
      signal, so the limit itself stops it): seconds from the run's start to the end of
      `treb run` (target: within 1 s of 3 s; state TIMEOUT).
  (c) the same flood, SIGINT to the attached `treb run` once the log holds 16 MB: seconds
      from the signal to its exit (target <= 1 s; exit code 130).
The attached output goes to a pseudo-terminal (or a pipe, `--sink pipe`) that this script
reads and discards, as a terminal would. `--src DIR` measures another checkout's code
(e.g. the code before a change). Child processes write .pyc files (PYTHONDONTWRITEBYTECODE
is unset).
Usage: python bench/flood.py [--rounds 5] [--writes lines|blocks] [--sink pty|pipe] [--src DIR]
                             [--skip-b-c]
"""

from __future__ import annotations

import argparse
import os
import pty
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median  # noqa: E402

LINES = """\
import sys
left, blocks = int(sys.argv[1]), sys.argv[2] == "blocks"
line = "step %06d loss 0.123456 lr 3e-4 tokens/s 123456.7 " + "x" * 47
if blocks:  # 0.8 MB writes of whole lines
    block = "".join(line % i + "\\n" for i in range(1 << 13)).encode()
    while left > 0:
        sys.stdout.buffer.write(block[:left])
        left -= len(block)
i = 0
while left > 0:  # one print() per line, unbuffered (PYTHONUNBUFFERED=1): a training log
    print(line % i)
    left -= 100
    i += 1
"""

NO_NEWLINE = """\
import signal, sys, time
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the timeout's warning: wait for the limit
chunk = b"x" * (1 << 16)
for _ in range(int(sys.argv[1]) >> 16):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.flush()
time.sleep(300)
"""


class Sink:
    """Where the attached `treb run` writes: a pty (or pipe) read and discarded."""

    def __init__(self, kind: str) -> None:
        if kind == "pty":
            self.read_fd, self.write_fd = pty.openpty()
        else:
            self.read_fd, self.write_fd = os.pipe()
        self.bytes = 0
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 1 << 20)
            except OSError:  # a pty whose other side is closed: EIO
                return
            if not data:
                return
            self.bytes += len(data)

    def close(self) -> None:
        os.close(self.write_fd)
        self.thread.join(10)
        os.close(self.read_fd)


class Bench:
    def __init__(self, work: Path, src: Path, sink: str) -> None:
        self.work = work
        self.home = work / "home"
        self.sink = sink
        self.env = {**os.environ, "TREB_HOME": str(self.home), "PYTHONPATH": str(src)}
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), self.env["PATH"]])
        self.treb = [sys.executable, "-m", "trebuchet"]
        (work / "lines.py").write_text(LINES)
        (work / "nonl.py").write_text(NO_NEWLINE)

    def spec(self, name: str, text: str) -> Path:
        path = self.work / f"{name}.yaml"
        path.write_text(text)
        return path

    def record(self) -> tuple[str, float | None, float | None, str]:
        with sqlite3.connect(self.home / "runs.db", timeout=30) as db:
            row = db.execute(
                "SELECT id, started_at, ended_at, state FROM runs ORDER BY created_at DESC LIMIT 1"
            ).fetchone()
        return row

    def clean(self) -> None:
        """Each run leaves hundreds of MB of logs: remove them before the next one."""
        subprocess.run(["rm", "-rf", str(self.home / "runs")], check=True)

    def attached(self, spec: Path, on_start=None) -> tuple[int, float, float, float]:
        """(exit code, wall seconds, epoch at exit, span) of an attached `treb run`."""
        sink = Sink(self.sink)
        t0, epoch0 = time.perf_counter(), time.time()
        proc = subprocess.Popen([*self.treb, "run", str(spec)], env=self.env, cwd=self.work,
                                stdin=subprocess.DEVNULL, stdout=sink.write_fd,
                                stderr=sink.write_fd)  # fmt: skip
        try:
            if on_start:
                on_start(proc)
            rc = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall, at = time.perf_counter() - t0, time.time()
        sink.close()
        return rc, wall, at, self.record()[2] - epoch0

    def detached(self, spec: Path) -> float:
        """Seconds from `treb run -d` to the run's recorded end."""
        t0 = time.time()
        subprocess.run([*self.treb, "run", "-d", str(spec)], env=self.env, cwd=self.work,
                       capture_output=True, check=True)  # fmt: skip
        while True:
            _, _, ended, _ = self.record()
            if ended:
                return ended - t0
            time.sleep(0.02)

    def flood_round(self, ranks: int, mb: int, writes: str) -> tuple[float, float, float]:
        per_rank = mb * 1_000_000 // ranks
        spec = self.spec("flood", f"command: [python, lines.py, '{per_rank}', {writes}]\n"
                                  f"procs_per_node: {ranks}\n")  # fmt: skip
        rc, wall, _, att_span = self.attached(spec)
        assert rc == 0, f"attached flood exited {rc}"
        self.clean()
        span = self.detached(spec)
        self.clean()
        return att_span, span, wall

    def timeout_round(self) -> float:
        spec = self.spec("timeout", f"command: [python, nonl.py, '{64 << 20}']\ntimeout: 3s\n")
        rc, _, at, _ = self.attached(spec)
        _, started, _, state = self.record()
        assert rc == 1 and state == "TIMEOUT", (rc, state)
        self.clean()
        return at - started

    def sigint_round(self) -> float:
        spec = self.spec("sigint", f"command: [python, nonl.py, '{64 << 20}']\n")
        sent: list[float] = []

        def interrupt(proc: subprocess.Popen) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                logs = list((self.home / "runs").glob("*/attempt-0/rank-0.log"))
                if logs and logs[0].stat().st_size >= 16 << 20:
                    break
                time.sleep(0.005)
            sent.append(time.time())
            proc.send_signal(signal.SIGINT)

        rc, _, at, _ = self.attached(spec, interrupt)
        _, _, _, state = self.record()
        assert rc == 130 and state == "CANCELLED", (rc, state)
        self.clean()
        return at - sent[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--mb", type=int, default=320)
    ap.add_argument("--writes", choices=["lines", "blocks"], default="lines",
                    help="(a): one print() per line, or 0.8 MB writes")  # fmt: skip
    ap.add_argument("--sink", choices=["pty", "pipe"], default="pty")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--skip-b-c", action="store_true", help="only case (a)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b = Bench(Path(tmp), args.src.resolve(), args.sink)
        print(f"# flood, code from {args.src}, {machine()}, {args.rounds} alternating rounds, "
              f"attached output to a {args.sink}, (a) written as {args.writes}")  # fmt: skip
        a_att, a_det, a_wall, tmo, intr = [], [], [], [], []
        for i in range(args.rounds):
            att, span, wall = b.flood_round(args.ranks, args.mb, args.writes)
            a_att.append(att)
            a_det.append(span)
            a_wall.append(wall)
            line = f"round {i}: (a) attached {att:.2f}s (wall {wall:.2f}s) detached {span:.2f}s"
            if not args.skip_b_c:
                tmo.append(b.timeout_round())
                intr.append(b.sigint_round())
                line += f"; (b) {tmo[-1]:.2f}s; (c) {intr[-1]:.2f}s"
            print(line, flush=True)
        att, det, wall = median(a_att), median(a_det), median(a_wall)
        print(f"(a) {args.ranks} ranks, {args.mb} MB of lines: run span attached {att:.2f}s, "
              f"detached {det:.2f}s, ratio {att / det:.2f} (target <= 1.2); attached "
              f"`treb run` wall {wall:.2f}s, {wall / det:.2f}x")  # fmt: skip
        if tmo:
            print(f"(b) timeout: 3s under 64 MB without a newline: run over {median(tmo):.2f}s "
                  "after the run started (target <= 4.0)")  # fmt: skip
            print(f"(c) SIGINT under the flood: exit {median(intr):.2f}s later (target <= 1.0)")


if __name__ == "__main__":
    main()
