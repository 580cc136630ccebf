"""Issue 27 on real runs of the local engine: a tqdm job's progress and ETA while it runs
(`treb status --json`, `treb ps`, `treb top`), a spec's own progress pattern, `treb logs
--dedup` over 4 ranks, and GPU use.

No GPU exists here: the GPU tests put a STAND-IN `nvidia-smi` (a shell script written by
the test, first on PATH) that answers the agent's query with fixed figures read from a file
the test controls, and TREB_FAKE_GPUS gives the ranks their masks (envs/gpus.py). What is
real: the runs, the agents' sampling child processes, the metrics store, the job
controller's idle-GPU rule. bench/gpu_check.py checks the sampling on a real GPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import needs, status_json, write_spec

pytestmark = pytest.mark.integration

TQDM_JOB = """\
import os, sys, time
from tqdm import tqdm
rank = int(os.environ["RANK"])
n = int(sys.argv[1]) if rank == 0 else 7  # rank 1's bar is another one: not read
for _ in tqdm(range(n), mininterval=0.1):
    time.sleep(float(sys.argv[2]))
"""


def wait_until(what: str, check, timeout: float = 120):
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def test_tqdm_job_progress_and_eta_while_it_runs(treb, tmp_path: Path) -> None:
    needs("tqdm")
    (tmp_path / "job.py").write_text(TQDM_JOB)
    spec = write_spec(tmp_path, "name: bar\ncommand: python job.py 300 0.1\nprocs_per_node: 2\n")
    res = treb("run", "-d", str(spec))
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:

        def midway() -> dict | None:
            p = status_json(treb, run)["progress"]
            return p if p and p["rate"] and 0.05 < p["fraction"] < 0.9 else None

        p = wait_until("a reading midway", midway)
        assert p["total"] == 300 and 0 < p["step"] < 300  # rank 0's bar, not rank 1's
        assert abs(p["fraction"] - p["step"] / 300) < 0.01
        # the ETA agrees with the rate and what is left (tqdm's own; aged since the reading)
        assert 0 < p["eta_s"] <= (300 - p["step"]) / p["rate"] * 1.5 + 2
        later = wait_until("a later reading", lambda: (q := status_json(treb, run)["progress"])
                           and q["step"] > p["step"] and q)  # fmt: skip
        assert later["fraction"] >= p["fraction"]
        ps = treb("ps").stdout
        assert re.search(rf"^{run} .*RUNNING .* \d+% \d+/300\s+\S+$", ps, re.M), ps
        assert "PROGRESS" in ps.splitlines()[0] and "ETA" in ps.splitlines()[0]
        listed = json.loads(treb("ps", "--json").stdout)
        assert next(r for r in listed if r["id"] == run)["progress"]["total"] == 300
        top = treb("top", "--once").stdout
        assert re.search(r"^  progress: \d+% \d+/300, ETA \S+$", top, re.M), top
        assert re.search(r"^  progress \d+% \d+/300, [0-9.]+ steps/s, ETA", treb("status", run)
                         .stdout, re.M)  # fmt: skip
    finally:
        treb("cancel", run)


def test_spec_progress_pattern_and_the_ended_run(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, """\
name: pattern
command: 'for i in 1 2 3 4 5; do echo "chunk $i of 5 (step 9/9)"; sleep 0.3; done'
metrics: {progress: 'chunk (?P<step>\\d+) of (?P<total>\\d+)'}
""")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    p = status_json(treb)["progress"]
    assert (p["step"], p["total"], p["fraction"], p["eta_s"]) == (5, 5, 1.0, None)
    plain = write_spec(tmp_path, "name: plain\ncommand: echo no progress here\n", "p.yaml")
    assert treb("run", str(plain)).returncode == 0
    assert status_json(treb)["progress"] is None
    assert "PROGRESS" not in treb("ps").stdout  # no run prints one: no column


DEDUP_JOB = r"""
echo "loading checkpoint"
echo "I am rank $RANK"
if [ "$RANK" -lt 2 ]; then echo "low half"; fi
for i in 1 2 3; do echo "epoch $i done"; done
if [ "$RANK" = 0 ]; then for i in $(seq 1 30); do echo "rank 0 detail $i"; done; fi
echo "saving checkpoint"
"""


def test_logs_dedup_over_four_ranks(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: dd\nnodes: 2\nprocs_per_node: 2\ncommand: |"
                      + DEDUP_JOB.replace("\n", "\n  ") + "\n")  # fmt: skip
    assert treb("run", str(spec)).returncode == 0
    run_dir = Path(status_json(treb)["run_dir"])
    before = {p.name: p.read_bytes() for p in (run_dir / "attempt-0").glob("rank-*.log")}
    res = treb("logs", "--dedup")
    assert res.returncode == 0, res.stderr
    shown = res.stdout.splitlines()
    assert shown[0] == "[0-3] loading checkpoint" and shown[-1] == "[0-3] saving checkpoint"
    for i in (1, 2, 3):
        assert shown.count(f"[0-3] epoch {i} done") == 1
    assert "[0-1] low half" in shown and "[3] I am rank 3" in shown
    assert sum(1 for s in shown if s.startswith("[0] rank 0 detail")) == 30
    assert len(shown) == 1 + 4 + 1 + 3 + 30 + 1
    assert treb("logs").stdout.count("loading checkpoint") == 4  # without --dedup: all
    after = {p.name: p.read_bytes() for p in (run_dir / "attempt-0").glob("rank-*.log")}
    assert after == before and after["rank-2.log"].count(b"loading checkpoint") == 1
    tail = treb("logs", "--dedup", "--tail", "2").stdout.splitlines()
    assert tail[-1] == "[0-3] saving checkpoint" and "[1-3] epoch 3 done" in tail


def test_logs_dedup_follows_a_running_run(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, """\
name: ddf
procs_per_node: 4
command: 'for i in 1 2 3 4; do echo "tick $i"; sleep 0.5; done; echo "rank $RANK out"'
""")  # fmt: skip
    res = treb("run", "-d", str(spec))
    assert res.returncode == 0, res.stderr
    out = treb("logs", "--dedup", "-f", timeout=120).stdout.splitlines()
    for i in (1, 2, 3, 4):
        assert f"[0-3] tick {i}" in out, out
    assert sorted(s for s in out if s.endswith(" out")) == [f"[{r}] rank {r} out" for r in range(4)]


def test_attached_run_dedups_with_treb_dedup(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: dda\nnodes: 2\nprocs_per_node: 2\ncommand: |"
                      + DEDUP_JOB.replace("\n", "\n  ") + "\n")  # fmt: skip
    res = treb("run", str(spec), env={"TREB_DEDUP": "1"})
    assert res.returncode == 0, res.stderr
    shown = res.stdout.splitlines()
    assert shown.count("[0-3] loading checkpoint") == 1, shown
    assert shown.count("[0-3] saving checkpoint") == 1 and "[2] I am rank 2" in shown
    assert sum(1 for s in shown if s.startswith("[0] rank 0 detail")) == 30
    plain = treb("run", str(spec)).stdout  # without it: each rank's own, node:local
    assert plain.count("loading checkpoint") == 4 and "[1:0] I am rank 2" in plain


STAND_IN = """#!/bin/sh
# STAND-IN for nvidia-smi (tests/integration/test_progress.py): no GPU exists here.
# Answers the agent's query for 4 GPUs, utilisation from $STANDIN_GPU_UTIL_FILE, and the
# health check's `-L` (runtime/node/health.py) with the same 4.
if [ "$1" = -L ]; then
    for i in 0 1 2 3; do echo "GPU $i: STAND-IN GPU (UUID: GPU-0000000$i)"; done; exit 0
fi
echo "$0 $*" >> "$STANDIN_GPU_CALLS"
util=$(cat "$STANDIN_GPU_UTIL_FILE")
echo "0, $util, 30000, 81559"
echo "1, $util, 1000, 81559"
echo "2, 99, 70000, 81559"
echo "3, 99, 70000, 81559"
"""


def stand_in(tmp_path: Path, util: int) -> dict[str, str]:
    """The environment of a `treb` whose PATH starts with the stand-in nvidia-smi."""
    bin_dir = tmp_path / "stand-in-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(STAND_IN)
    smi.chmod(0o755)
    (tmp_path / "util").write_text(f"{util}\n")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STANDIN_GPU_UTIL_FILE": str(tmp_path / "util"),
        "STANDIN_GPU_CALLS": str(tmp_path / "calls"),
        "TREB_FAKE_GPUS": "nvidia:2",  # the masks: this node's ranks see GPUs 0 and 1
    }


def test_gpu_sampling_with_a_stand_in_nvidia_smi(treb, tmp_path: Path) -> None:
    env = stand_in(tmp_path, 42)
    spec = write_spec(tmp_path, "name: gpus\ngpus_per_node: 2\ncommand: sleep 4\n")
    res = treb("run", "-d", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:
        st = wait_until("a sample", lambda: (s := status_json(treb, run))["gpus"] and s)
        assert [(g["node"], g["index"], g["util"]) for g in st["gpus"]] == [
            (0, 0, 42.0),
            (0, 1, 42.0),
        ]
        top = treb("top", "--once").stdout
        assert "gpus: n0:g0 42% 29.3/80 GiB, n0:g1 42% 1.0/80 GiB" in top, top
    finally:
        wait_until("the end", lambda: status_json(treb, run)["state"] == "SUCCEEDED")
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls and all("--query-gpu=index,utilization.gpu,memory.used,memory.total" in c
                         for c in calls)  # fmt: skip
    got = json.loads(treb("metrics", run, "--json").stdout)["metrics"]
    assert got["gpu.util.n0.g0"]["last"]["value"] == 42.0
    assert got["gpu.mem.n0.g1"]["last"]["value"] == 1000.0
    assert not [n for n in got if ".g2" in n or ".g3" in n]  # outside the node's mask
    assert "GPUs    n0:g0 42%" in treb("status", run).stdout


def test_a_stuck_nvidia_smi_never_holds_the_agent(treb, tmp_path: Path) -> None:
    env = stand_in(tmp_path, 42)
    smi = Path(env["PATH"].split(os.pathsep)[0]) / "nvidia-smi"
    smi.write_text("#!/bin/sh\n# STAND-IN nvidia-smi whose queries never answer (a driver that\n"
                   "# wedged after the health check's `-L` before the ranks)\n"
                   '[ "$1" = -L ] && { echo "GPU 0: STAND-IN"; echo "GPU 1: STAND-IN"; exit 0; }\n'
                   "sleep 600; echo never\n")  # fmt: skip
    spec = write_spec(tmp_path, "name: stuck\ngpus_per_node: 2\ncommand: sleep 7\n")
    res = treb("run", str(spec), env=env, timeout=60)  # the hang guard: a blocked poll
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    assert st["gpus"] == [{"node": 0, "error": "nvidia-smi did not answer in 5s"}]
    left = subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, text=True)
    mine = [p for p in left.stdout.split() if str(tmp_path) in _environ_of(p)]
    assert not mine  # the query's whole group was ended, its sleeping child too


def _environ_of(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_no_gpus_asked_no_sampling(treb, tmp_path: Path) -> None:
    env = stand_in(tmp_path, 42)
    spec = write_spec(tmp_path, "name: cpu\ncommand: sleep 1\n")
    assert treb("run", str(spec), env=env).returncode == 0
    assert not (tmp_path / "calls").exists() and status_json(treb)["gpus"] == []


@pytest.mark.parametrize(("util", "action"), [(0, "warn"), (0, "fail"), (80, "fail")])
def test_idle_gpu_timeout(treb, tmp_path: Path, util: int, action: str) -> None:
    env = stand_in(tmp_path, util)
    spec = write_spec(tmp_path, f"""\
name: idle
gpus_per_node: 2
command: sleep 12
idle_gpu_timeout: 4s
idle_gpu_action: {action}
""")  # fmt: skip
    res = treb("run", str(spec), env=env, timeout=120)
    st = status_json(treb)
    events = [json.loads(ln) for ln in (Path(st["run_dir"]) / "events.jsonl").open()]
    idle = [e for e in events if e.get("kind", e.get("event")) == "idle_gpu"]
    if util:  # busy GPUs: the rule never fires
        assert res.returncode == 0 and st["state"] == "SUCCEEDED" and not idle, res.stderr
        return
    assert idle and idle[0]["action"] == action and idle[0]["gpus"] == 2, events
    assert "idle GPUs: none of 2 GPU(s) on 1 node(s) was busy" in res.stderr
    if action == "warn":
        assert res.returncode == 0 and st["state"] == "SUCCEEDED"
        assert len(idle) == 1  # once per idle spell
    else:
        assert res.returncode == 1 and st["state"] == "FAILED"
        assert st["attempts"][-1]["reason"] == "idle_gpu"
        assert float(idle[0]["idle_s"]) < 12  # it did not wait for the command's end
        assert st["diagnosis"]["root_cause"]["category"] == "idle_gpu", st["diagnosis"]
