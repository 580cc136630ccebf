"""treb's own work per run as the node count grows (issue 36, docs/scale.md): counts of
operations, never timings. The local engine's supervisor drives one agent per simulated
node in its one loop, so per-node work there is serial: what the figures of
bench/scale.py showed growing with nodes is pinned here as a count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import write_spec
from trebuchet.runtime.rundir import records

# Every Python process of the run (`treb run`, its supervisor, the simulated nodes' keepers)
# counts its os.fsync calls by what they flushed, through a sitecustomize on PYTHONPATH:
# the run's real code, real ranks. Each process rewrites its counts at each call (it may
# end in os._exit).
COUNTING = """\
import json, os, stat
out = os.environ.get("TREB_TEST_FSYNC_OUT")
if out:
    counts, real = {}, os.fsync
    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = "?"
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        key = kind + " " + os.path.basename(path)
        counts[key] = counts.get(key, 0) + 1
        mine = os.path.join(out, str(os.getpid()))
        with open(mine + ".tmp", "w") as fh:
            fh.write(json.dumps(counts))
        os.replace(mine + ".tmp", mine)
        return real(fd)
    os.fsync = fsync
"""


def fsyncs_of_a_run(tmp_path: Path, nodes: int) -> dict[str, int]:
    """fsyncs of one attached `treb run` of `nodes` x 2 ranks, summed over its processes."""
    spec = write_spec(tmp_path, f"name: count\ncommand: 'true'\nnodes: {nodes}\n"
                                "procs_per_node: 2\nsnapshot: false\n")  # fmt: skip
    hook, out = tmp_path / "hook", tmp_path / "fsyncs"
    hook.mkdir()
    out.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTING)
    path = os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TREB_TEST_FSYNC_OUT": str(out)}
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", str(spec)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    counts: dict[str, int] = {}
    for f in out.iterdir():
        if not f.name.endswith(".tmp"):
            for k, v in json.loads(f.read_text()).items():
                counts[k] = counts.get(k, 0) + v
    return counts


def test_the_attempt_folder_is_synced_once_whatever_the_node_count(
    treb_home: Path, tmp_path: Path
) -> None:
    """Each simulated node's agent synced its ENDED records and then the attempt's folder
    when its last rank ended: 128 nodes, 128 fsyncs of the same folder one after the other
    in the supervisor's loop, before the retry could start (bench/scale.py: a rank's failure
    -> the retry running took 10.9 s at 128 nodes x 4). The supervisor syncs all its agents'
    records at once: the folder once per attempt, at 1 node as at 12."""
    one = fsyncs_of_a_run(tmp_path / "one", 1)
    many = fsyncs_of_a_run(tmp_path / "many", 12)
    assert one.get("dir attempt-0") == 1, one
    assert many.get("dir attempt-0") == 1, many
    assert many.get("file rank-23.json") == 1, many  # each ENDED record still synced


@pytest.mark.parametrize("n", [64, 2])
def test_records_and_their_folder_are_synced_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """One fsync after another cost a journal commit each: 512 ENDED records of a 128-node
    local run took 2.5 s of the retry's critical path here, against 0.1-0.2 s issued from
    16 threads (one commit carries many); a 2-rank run's two records and their folder ~11
    ms one after another, ~4 ms together. Every file and the folder (the renames) are
    synced once each, from several threads."""
    paths = []
    for i in range(n):
        records.write_json(str(tmp_path / f"rank-{i}.json"), {"i": i}, durable=False)
        paths.append(str(tmp_path / f"rank-{i}.json"))
    seen: list[tuple[int, str]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append((threading.get_ident(), os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    records.sync(paths)
    assert sorted(p for _, p in seen) == sorted([*paths, str(tmp_path)]), seen
    assert len({t for t, _ in seen}) > 1, "all from one thread"
