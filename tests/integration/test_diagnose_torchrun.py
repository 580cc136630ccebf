"""Diagnosis of logs trebuchet did not launch: torchrun run directly, its console log (the
"Root Cause (first observed failure)" report, `[default0]:` prefixes), its error files
(@record) and its per-rank log directory (--log-dir --redirects)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs

pytestmark = pytest.mark.integration


def torchrun(tmp_path: Path, script: str, nproc: int, *flags: str, env: dict | None = None) -> Path:
    """Run torchrun on `script`; returns the console log (stdout and stderr together)."""
    needs("torch")
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    (tmp_path / "job.py").write_text(script)
    console = tmp_path / "console.log"
    with open(console, "w") as out:
        res = subprocess.run(
            [exe, "--nproc_per_node", str(nproc), "--master_port", "0", *flags, "job.py"],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, timeout=180,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        )  # fmt: skip
    assert res.returncode != 0
    return console


def diagnose(*paths: Path) -> dict:
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", *map(str, paths),
                          "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def torchrun_root(console: Path) -> int:
    """The rank torchrun's own report blames."""
    text = console.read_text()
    block = text.split("Root Cause (first observed failure):", 1)[1]
    return int(re.search(r"rank\s*:\s*(\d+)", block).group(1))


RECORD = """
import os, time
from torch.distributed.elastic.multiprocessing.errors import record

def read_shard(i):
    raise KeyError(f"missing column 'label' in shard {i}")

@record
def main():
    if os.environ["RANK"] == "1":
        time.sleep(0.5)
        read_shard(7)
    time.sleep(120)

main()
"""


def test_console_log_and_error_file(tmp_path: Path) -> None:
    console = torchrun(tmp_path, RECORD, 2, "--log-dir", str(tmp_path / "logs"))
    assert "error_file: " + str(tmp_path / "logs") in console.read_text()
    for target in (console, tmp_path / "logs"):
        data = diagnose(target)
        root = data["root_cause"]
        assert (root["category"], root["rank"]) == ("python_exception", 1), (target, root)
        assert "KeyError" in root["summary"] and "shard 7" in root["summary"]
        assert "job.py:6 in read_shard" in root["summary"]
    assert any(r["rank"] == 0 and r["role"] == "stopped" for r in diagnose(console)["ranks"])


HANG = """
import datetime, os, time
import torch.distributed as dist
if os.environ["RANK"] == "2":
    print("rank 2 waits for its data", flush=True)
    time.sleep(120)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
"""


def test_collective_timeout_blames_the_rank_that_never_joined(tmp_path: Path) -> None:
    console = torchrun(tmp_path, HANG, 4, "--tee", "3")
    assert torchrun_root(console) != 2  # torchrun blames the first rank that timed out
    data = diagnose(console)
    root = data["root_cause"]
    assert (root["category"], root["rank"]) == ("collective_timeout", 2), root
    assert "rank 2 never joined" in root["summary"]
    roles = {r["rank"]: r["role"] for r in data["ranks"]}
    assert roles[2] == "root_cause" and roles[0] != "root_cause"


SEGV = """
import os, time, ctypes
if os.environ["RANK"] == "1":
    time.sleep(0.5)
    ctypes.string_at(0)
time.sleep(120)
"""


def test_segfault_from_console_and_from_per_rank_logs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    console = torchrun(tmp_path, SEGV, 2, "--log-dir", str(logs), "--redirects", "3",
                       env={"PYTHONFAULTHANDLER": "1"})  # fmt: skip
    root = diagnose(console)["root_cause"]
    assert (root["category"], root["rank"]) == ("segfault", 1), root
    assert "SIGSEGV" in root["summary"]
    # the per-rank directory alone: <log_dir>/<run>/attempt_0/<local_rank>/stderr.log
    assert list(logs.rglob("attempt_0/1/stderr.log"))
    root = diagnose(logs)["root_cause"]
    assert (root["category"], root["rank"]) == ("segfault", 1), root
    assert any("Segmentation fault" in e for e in root["evidence"])
