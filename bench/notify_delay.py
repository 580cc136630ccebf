"""The webhook's delay after a run's end (docs/notify.md): seconds from the run's end as
recorded (`ended_at` in `treb status --json`, the run_ended event's time) to the moment a
real local HTTP receiver got the signed `succeeded` / `failed` POST. Median and max of
`--repeats` attached runs (2 ranks that sleep `--seconds`, then exit 0 or 1, alternated),
each in its own TREB_HOME.

Usage: python bench/notify_delay.py [--on local|slurm] [--repeats 7] [--seconds 2]
(Slurm: inside scripts/with-slurm-cluster, with a receiver on the cluster's bridge.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KEY = "bench-key"


def receiver(host: str) -> tuple[ThreadingHTTPServer, list[tuple[float, dict]]]:
    got: list[tuple[float, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            at = time.time()
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((at, json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def bridge_address() -> str:
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text()
    found = re.search(r"^SlurmctldHost=[^(]+\(([0-9.]+)\)", conf, re.M)
    return found.group(1) if found else "127.0.0.1"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--on", default="local")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0, help="each run's length")
    args = ap.parse_args()
    host = bridge_address() if args.on == "slurm" else "127.0.0.1"
    server, got = receiver("0.0.0.0" if args.on == "slurm" else host)
    url = f"http://{host}:{server.server_address[1]}/bench"
    delays = []
    for i in range(args.repeats):
        folder = Path(tempfile.mkdtemp(prefix="treb-bench-notify-", dir=os.environ.get("TMPDIR")))
        command = f"sleep {args.seconds}; exit {i % 2}"
        spec = folder / "job.yaml"
        spec.write_text(f"name: notify-bench\ncommand: {command}\nprocs_per_node: 2\n"
                        f"notify:\n  - url: {url}\n    on: [succeeded, failed]\n"
                        "    secret: TREB_BENCH_KEY\n")  # fmt: skip
        env = {**os.environ, "TREB_HOME": str(folder / "home"), "TREB_BENCH_KEY": KEY}
        if args.on == "slurm":
            env["TREB_HOME"] = os.environ.get("TREB_HOME", str(folder / "home"))
        before = len(got)
        subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec), "--on", args.on],
                       env=env, capture_output=True, timeout=600)  # fmt: skip
        st = json.loads(subprocess.run([sys.executable, "-m", "trebuchet", "status", "--json"],
                                       env=env, capture_output=True, text=True).stdout)  # fmt: skip
        deadline = time.time() + 10
        while len(got) == before and time.time() < deadline:
            time.sleep(0.01)
        if len(got) == before:
            raise SystemExit(f"run {st['id']}: no POST within 10 s of its end")
        at, body = got[-1]
        assert body["run_id"] == st["id"] and body["state"] == st["state"], (body, st)
        delays.append(at - st["ended_at"])
    server.shutdown()
    ms = sorted(d * 1000 for d in delays)
    print(f"webhook delay after the run's end ({args.on}, {args.repeats} runs of "
          f"{args.seconds:g} s): median {statistics.median(ms):.1f} ms, "
          f"min {ms[0]:.1f} ms, max {ms[-1]:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
