"""CLI start-up: `treb --help` and `treb ps` with 1,000 runs in the store (target < 0.25 s).

The store is filled through the real Store API with finished runs, then each command is
timed alternately with a bare `python -c pass` as the floor this machine imposes.
Usage: python bench/cli_startup.py [--repeats 15] [--runs 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, machine, median  # noqa: E402


def fill_store(home: Path, count: int) -> None:
    os.environ["TREB_HOME"] = str(home)
    from trebuchet.store.db import RunRecord, Store
    from trebuchet.store.paths import run_dir

    store = Store()
    now = time.time()
    with store.transaction():
        for i in range(count):
            rid = f"{i:08x}"
            store.insert_run(
                RunRecord(
                    id=rid,
                    name=f"bench-{i % 17}",
                    backend="local",
                    launcher="native",
                    state="SUCCEEDED" if i % 5 else "FAILED",
                    nodes=1 + i % 4,
                    procs_per_node=2,
                    run_dir=str(run_dir(rid)),
                    created_at=now - (count - i) * 60,
                    started_at=now - (count - i) * 60 + 1,
                    ended_at=now - (count - i) * 60 + 30,
                )  # fmt: skip
            )
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--runs", type=int, default=1000)
    args = ap.parse_args()
    treb = shutil.which("treb")
    if not treb:
        raise SystemExit("needs treb on PATH (run `make bench`)")
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        fill_store(home, args.runs)
        env = {**os.environ, "TREB_HOME": str(home)}
        cmds = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "treb --help": [treb, "--help"],
            "treb ps": [treb, "ps"],
            "treb ps --all": [treb, "ps", "--all"],
            "treb ps --json": [treb, "ps", "--json"],
        }
        t = alternate(cmds, args.repeats, env)
        print(
            f"# CLI start-up, {args.runs} runs in the store, {machine()}, median of {args.repeats}"
        )
        for name, xs in t.items():
            print(f"{name:<16} {median(xs):.3f} s")


if __name__ == "__main__":
    main()
