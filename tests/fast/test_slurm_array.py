"""A sweep on Slurm is one job array: its script (golden, UPDATE_GOLDEN=1 rewrites), the
recorded array task ids, the dispatch to each point's own script, and the refusals.

Why: the array script is what Slurm runs for every point; a wrong index, a point's output
outside its run dir or points of different shapes in one array would mix up the runs.
sbatch is a stub here (no cluster): tests/integration/test_slurm_sweeps.py runs it for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trebuchet.backends.slurm.state import base_ids

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SPEC = """\
name: swept
command: echo lr=$LR bs=$BS
nodes: 2
procs_per_node: 2
timeout: 10m
slurm:
  partition: debug
sweep_parallel: 2
"""


@pytest.fixture
def fake_slurm(tmp_path: Path, treb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch that keeps the script it was given and answers job id 4242."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    kept = tmp_path / "sbatch-calls"
    (bin_dir / "sbatch").write_text(
        f'#!/bin/bash\nprintf "%s\\n" "$*" >>{kept}\necho "4242;cluster"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return kept


def _treb(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)  # fmt: skip


def _sweep(tmp_path: Path, spec: str, *extra: str) -> subprocess.CompletedProcess:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "job.yaml").write_text(spec)
    return _treb("run", str(work / "job.yaml"), "--on", "slurm", "--detach", "--no-check",
                 "--sweep", *extra, cwd=work)  # fmt: skip


def test_a_sweep_is_one_array_job(fake_slurm: Path, tmp_path: Path, treb_home: Path) -> None:
    res = _sweep(tmp_path, SPEC, "-o", "env.LR=1,2", "-o", "env.BS=3,4")
    assert res.returncode == 0, res.stderr
    sweep_id = res.stdout.strip()
    calls = fake_slurm.read_text().splitlines()
    assert len(calls) == 1  # one sbatch for the whole sweep
    script_path = Path(calls[0].split()[-1])
    assert script_path == treb_home / "sweeps" / f"{sweep_id}.sbatch"
    runs = json.loads(_treb("ps", "--json", cwd=tmp_path).stdout)
    runs.sort(key=lambda r: r["backend_id"])
    assert [r["backend_id"] for r in runs] == [f"4242_{i}" for i in range(4)]
    assert {r["sweep_id"] for r in runs} == {sweep_id}
    assert [json.loads(r["params"]) for r in runs] == [
        {"env.LR": lr, "env.BS": bs} for lr in ("1", "2") for bs in ("3", "4")
    ]
    # The golden array script: shared header, --array with the % limit, the dispatch.
    text = script_path.read_text()
    normal = text.replace(sweep_id, "SWEEP").replace(str(treb_home), "$TREB_HOME")
    for i, r in enumerate(runs):
        normal = normal.replace(r["id"], f"RUN{i}")
    golden = GOLDEN / "slurm-array.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    assert subprocess.run(["bash", "-n", str(script_path)]).returncode == 0
    for r in runs:  # each point keeps its own full script, with its own run dir baked in
        own = (Path(r["run_dir"]) / "submit.sbatch").read_text()
        assert f"TREB_RUN_DIR={r['run_dir']}" in own or f"TREB_RUN_DIR='{r['run_dir']}'" in own
        assert f"export LR={json.loads(r['params'])['env.LR']}" in own


def test_each_array_task_runs_its_own_point(fake_slurm: Path, tmp_path: Path, treb_home) -> None:
    res = _sweep(tmp_path, SPEC, "-o", "env.LR=1,2,3")
    assert res.returncode == 0, res.stderr
    sweep_id = res.stdout.strip()
    runs = {r["backend_id"]: r for r in json.loads(_treb("ps", "--json", cwd=tmp_path).stdout)}
    for r in runs.values():  # stand-ins for the points' scripts: who am I, where does output go
        (Path(r["run_dir"]) / "submit.sbatch").write_text(
            'echo "point $TREB_PROBE pid $$"; echo "to stderr" >&2\n'
        )
    script = treb_home / "sweeps" / f"{sweep_id}.sbatch"
    for task in ("2", "0"):
        probe = subprocess.run(
            ["bash", "-c", f'echo "$$" >"{tmp_path}/pid.{task}"; exec bash "{script}"'],
            env={**os.environ, "SLURM_ARRAY_TASK_ID": task, "TREB_PROBE": task},
            capture_output=True, text=True,
        )  # fmt: skip
        assert probe.returncode == 0 and probe.stdout == "", probe.stderr
        log = (Path(runs[f"4242_{task}"]["run_dir"]) / "batch.log").read_text()
        pid = (tmp_path / f"pid.{task}").read_text().strip()
        assert log == f"point {task} pid {pid}\nto stderr\n"  # same pid: Slurm's signals reach it
    assert not (Path(runs["4242_1"]["run_dir"]) / "batch.log").exists()
    bad = subprocess.run(["bash", str(script)], env={**os.environ, "SLURM_ARRAY_TASK_ID": "7"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "no run for array task 7" in bad.stderr


def test_no_parallel_limit_when_unset(fake_slurm: Path, tmp_path: Path, treb_home: Path) -> None:
    res = _sweep(tmp_path, SPEC.replace("sweep_parallel: 2\n", ""), "-o", "env.LR=1,2")
    assert res.returncode == 0, res.stderr
    text = (treb_home / "sweeps" / f"{res.stdout.strip()}.sbatch").read_text()
    assert "#SBATCH --array=0-1\n" in text


@pytest.mark.parametrize(
    "override,field",
    [
        (
            "nodes=1,2",
            "nodes differs between points (--nodes=1 at nodes=1 vs --nodes=2 at nodes=2)",
        ),
        ("timeout=5m,10m", "slurm.time / timeout differs"),
        ("slurm.partition=a,b", "slurm.partition differs"),
        ("gpus_per_node=0,1", "gpus_per_node differs between points (no --gpus-per-node at"),
    ],
)
def test_points_of_different_shapes_are_refused(
    override: str, field: str, fake_slurm: Path, tmp_path: Path, treb_home: Path
) -> None:
    res = _sweep(tmp_path, SPEC, "-o", override)
    assert res.returncode == 2, res.stderr
    assert f"sweep on slurm: {field}" in res.stderr and "one job array" in res.stderr
    assert "Traceback" not in res.stderr
    assert not fake_slurm.exists()  # nothing submitted ...
    assert json.loads(_treb("ps", "--json", cwd=tmp_path).stdout) == []  # ... nor recorded


def test_launcher_and_env_may_differ(fake_slurm: Path, tmp_path: Path, treb_home: Path) -> None:
    """Only the #SBATCH header is shared: what runs inside the allocation may differ."""
    res = _sweep(tmp_path, SPEC, "-o", "env.X=a,b", "-o", "pre=true,echo hi")
    assert res.returncode == 0, res.stderr


def test_sbatch_refusal_fails_every_point(tmp_path: Path, treb_home: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/bash\necho 'sbatch: error: Batch job submission "
        "failed: Invalid partition name specified' >&2\nexit 1\n"
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    res = _sweep(tmp_path, SPEC, "-o", "env.LR=1,2")
    assert res.returncode == 2 and "sbatch refused the job array: " in res.stderr
    assert "Invalid partition" in res.stderr
    runs = json.loads(_treb("ps", "--json", cwd=tmp_path).stdout)
    assert [r["state"] for r in runs] == ["FAILED", "FAILED"]


def test_array_tasks_are_asked_for_by_their_array() -> None:
    assert base_ids(["12_3", "12_0", "9", "12_1", "10_0"]) == ["10", "12", "9"]


def test_an_array_excludes_the_nodes_treb_marked_bad(
    fake_slurm: Path, tmp_path: Path, treb_home: Path
) -> None:
    """A sweep's job array keeps off the nodes with a bad history as a single job does
    (docs/nodes.md): one `#SBATCH --exclude` after the shared header, which holds the
    spec's own excludes too, and each point's run records the `nodes_avoided` event.
    Before, the array got no --exclude at all."""
    from tests.fast.test_node_history import lost, plant

    plant("aaaa0005", [lost("tn2"), lost("tn3", attempt=1)])
    spec = SPEC.replace("  partition: debug\n",
                        "  partition: debug\n  sbatch_args: ['--exclude=gpu1']\n")  # fmt: skip
    res = _sweep(tmp_path, spec, "-o", "env.LR=1,2")
    assert res.returncode == 0, res.stderr
    text = (treb_home / "sweeps" / f"{res.stdout.strip()}.sbatch").read_text()
    excludes = [ln for ln in text.splitlines() if ln.startswith("#SBATCH --exclude")]
    assert excludes[-1] == "#SBATCH --exclude=gpu1,tn2,tn3", text  # sbatch takes the last
    assert text.index(excludes[-1]) < text.index("#SBATCH --array"), text
    assert sum("avoiding" in ln for ln in res.stderr.splitlines()) == 1, res.stderr
    runs = json.loads(_treb("ps", "--json", cwd=tmp_path).stdout)
    for r in runs:
        if r["id"] == "aaaa0005":
            continue
        events = (Path(r["run_dir"]) / "events.jsonl").read_text().splitlines()
        avoided = [json.loads(e) for e in events if '"nodes_avoided"' in e]
        assert [e["hosts"] for e in avoided] == [["tn2", "tn3"]], events


def test_points_that_avoid_different_nodes_are_refused(
    fake_slurm: Path, tmp_path: Path, treb_home: Path
) -> None:
    """One array has one --exclude: a sweep over allow_nodes is a named refusal (exit 2),
    nothing submitted, no point left PENDING."""
    from tests.fast.test_node_history import lost, plant

    plant("aaaa0005", [lost("tn2"), lost("tn3", attempt=1)])
    res = _sweep(tmp_path, SPEC, "-o", "allow_nodes=tn2,tn3")
    assert res.returncode == 2, res.stderr
    assert "the nodes to avoid differ between points" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not fake_slurm.exists()
    runs = json.loads(_treb("ps", "--all", "--json", cwd=tmp_path).stdout)
    assert {r["state"] for r in runs if r["id"] != "aaaa0005"} == {"FAILED"}, runs
