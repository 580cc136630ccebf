"""Attacks on nodes remembered across runs (docs/nodes.md): the spec's own Slurm host
lists merged with the avoided nodes, and an events.jsonl far larger than its node marks."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TrebFn, write_spec
from tests.fast.test_node_history import lost, plant

BASE = "command: python3 train.py\nnodes: 1\n"


def _excludes(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH --exclude")]


def test_a_bad_nodelist_in_sbatch_args_is_a_named_error_not_a_traceback(
    treb: TrebFn, tmp_path: Path
) -> None:
    plant("aaaa0101", [lost("tn2")])
    for bad in ("tn[1-", "tn[1-99999999]", "tn]", "tn[1-\u00b2]", "tn[0-" + "9" * 5000 + "]"):
        spec = BASE + f"slurm:\n  sbatch_args: ['--nodelist={bad}']\n"
        res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
        assert res.returncode == 2, (bad, res.stderr[-2000:])
        assert "Traceback" not in res.stderr and "sbatch_args" in res.stderr, res.stderr
        assert bad[:60] in res.stderr, res.stderr


def test_the_specs_exclude_file_is_merged_by_its_hosts_not_by_its_path(
    treb: TrebFn, tmp_path: Path
) -> None:
    """sbatch reads an --exclude value holding a `/` as a file of host names: `file,tn2`
    names no file, and sbatch refuses the job."""
    plant("aaaa0102", [lost("tn2")])
    hosts = tmp_path / "bad-nodes"
    hosts.write_text("gpu7\ngpu[8-9],gpu[11,13]\n")
    spec = BASE + f"slurm:\n  sbatch_args: ['--exclude={hosts}']\n"
    res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
    assert res.returncode == 0, res.stderr
    assert _excludes(res.stdout)[-1] == "#SBATCH --exclude=gpu7,gpu[8-9],gpu[11,13],tn2", res.stdout
    # a file sbatch could not read either is the spec's error, named, exit 2
    spec = BASE + f"slurm:\n  sbatch_args: ['--exclude={tmp_path}/none']\n"
    res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"{tmp_path}/none" in res.stderr, res.stderr


def test_a_huge_events_file_is_read_in_bounded_memory(treb_home: Path) -> None:
    """A run's events.jsonl of 160 MiB (one line of it 32 MiB): the marks are found, and the
    reader's memory does not grow with the file (before: the whole file, its text and its
    lines at once, ~5x its size)."""
    run_dir = plant("aaaa0103", [])
    pad = json.dumps({"event": "progress", "time": time.time(), "pad": "x" * 400}) + "\n"
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('{"event": "node_lost", "pad": "' + "y" * (32 << 20) + '"}\n')
        for _ in range(128):
            fh.write(pad * ((1 << 20) // len(pad)))
        fh.write(json.dumps(lost("tn5")) + "\n")
    code = (
        "import resource, json; from trebuchet.store.db import Store; "
        "from trebuchet.store.nodes import sync, known_hosts; s = Store(); sync(s); "
        "print(json.dumps([known_hosts(s), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    hosts, peak_mib = json.loads(out)
    assert hosts == ["tn5"]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # this pytest, for scale
    assert peak_mib < 150 + min(base, 150), peak_mib
