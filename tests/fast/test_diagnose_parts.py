"""The parts of diagnosis that do not need a failing program: line prefixes, timestamps,
the exit-code table, the catalog's shape, reading a big log from its end, and the
import rule (only `treb diagnose` and `treb status` load the diagnose package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trebuchet.diagnose import catalog, scan
from trebuchet.diagnose.lines import parse


def test_categories_are_the_issues_names() -> None:
    assert catalog.CATEGORIES == (
        "python_exception", "killed", "gpu_oom", "collective_timeout", "hang", "idle_gpu",
        "port_in_use",
        "network_unreachable", "missing_module", "bad_command", "launcher_missing",
        "missing_file", "disk_full",
        "environment_build", "setup_failed", "node_unhealthy", "node_lost", "launch_env_missing", "segfault", "aborted", "exit_abort", "time_limit",
        "node_failure", "scheduler_refusal", "cancelled", "stopped_by_slurm", "unknown",
    )  # fmt: skip
    assert all(catalog.REMEDIES[c] and "\n" not in catalog.REMEDIES[c] for c in catalog.CATEGORIES)
    assert {r.category for r in catalog.RULES} <= set(catalog.CATEGORIES) | {"cascade"}


def test_exit_code_table() -> None:
    assert "Python" in catalog.EXIT_CODES[1]
    assert "SIGKILL" in catalog.exit_meaning(137) and "OOM" in catalog.exit_meaning(137)
    assert "SIGTERM" in catalog.exit_meaning(143) and "cascade" in catalog.exit_meaning(143)
    assert "SIGSEGV" in catalog.exit_meaning(139)
    assert "SIGABRT" in catalog.exit_meaning(134)
    assert "SIGKILL" in catalog.exit_meaning(-9)  # torchrun writes -9
    assert catalog.signal_of(137, None) == "SIGKILL"
    assert catalog.signal_of(-15, None) == "SIGTERM"
    assert catalog.signal_of(1, None) is None


def test_rank_prefixes_and_timestamps() -> None:
    ln = parse("[default3]:[rank3]: RuntimeError: boom")
    assert (ln.rank, ln.local_rank, ln.text) == (3, 3, "RuntimeError: boom")
    ln = parse("[default1]:Traceback (most recent call last):")
    assert (ln.rank, ln.local_rank) == (None, 1)
    ln = parse("2024-11-20 14:37:16 [rank3]: torch.OutOfMemoryError: CUDA out of memory.")
    assert ln.rank == 3 and ln.ts is not None and ln.text.startswith("torch.OutOfMemoryError")
    assert parse("3: ValueError: x", srun_labels=True).rank == 3
    assert parse("3: ValueError: x").rank is None
    assert parse("[1,5]<stderr>:Segmentation fault").rank == 5
    assert parse("[rank=7] hello").rank == 7
    assert parse("[rank 7] hello").rank == 7
    a = parse("[E1129 09:55:18.260098571 socket.cpp:469] x").ts
    b = parse("[E1129 09:55:19.100000000 socket.cpp:469] x").ts
    assert a is not None and b is not None and 0.8 < b - a < 0.9


def test_a_big_log_is_read_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    noise = b"step 123 loss 0.4567 lr 0.0003 tokens/s 12345.6\n" * 2000
    with open(log, "wb") as fh:
        fh.write(b"Traceback (most recent call last):\nValueError: an old, handled one\n")
        for _ in range(400):  # ~40 MB of quiet training output
            fh.write(noise)
        fh.write(b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                 b"    step()\nValueError: the real one\n")  # fmt: skip
    sc = scan.scan(log)
    assert sc.size > 30 << 20
    assert sc.size - sc.start <= 2 * scan.CHUNK  # a few hundred kB, not 40 MB
    assert any("the real one" in ln for ln in sc.lines)
    assert not any("old, handled" in ln for ln in sc.lines)


def test_diagnose_is_imported_only_by_its_verbs(tmp_path: Path) -> None:
    env = {**os.environ, "TREB_HOME": str(tmp_path)}
    probe = (
        "import sys, json\nfrom trebuchet.cli.main import main, build_parser\n"
        "build_parser().format_help()\nmain(['ps'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('trebuchet.diagnose',"
        " 'trebuchet.results', 'torch')))))\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         check=True)  # fmt: skip
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


def test_a_log_without_a_failure_has_no_root_cause(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("epoch 1 loss 0.5\nepoch 2 loss 0.4\n")
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", str(log), "--json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(res.stdout)["root_cause"] is None
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", "missing/file.log"],
                         capture_output=True, text=True, env={**os.environ, "TREB_HOME": str(tmp_path)})  # fmt: skip
    assert res.returncode == 2 and "no such file or directory" in res.stderr
