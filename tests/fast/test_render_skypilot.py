"""`treb render --on skypilot`: golden task YAMLs, SkyPilot's own parser when available, and
the `run:` script executed here with SkyPilot's variables (quoting, ranks, teardown)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import in_ci
from trebuchet.cli.main import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SPEC = """\
name: sky-job
command: python train.py --lr ${LR:-0.1} "$RANK"
nodes: 2
gpus_per_node: 8
master_port: 29511
retries: 2
timeout: 2h
secrets: [HF_TOKEN]
env:
  OMP_NUM_THREADS: 3
  QUOTED: "it's a $value; rm -rf /"
  FROM_SECRET: ${HF_TOKEN}
environment:
  python: "3.11"
  requirements: [torch, "numpy>=2"]
skypilot: {cloud: aws, accelerators: H100, use_spot: true, region: us-east-1, disk_size: 200}
"""
HOSTILE = "printf '%s\\n' \"it's\" '$(whoami)' '`id`' \"a\nb\" > \"$OUT/$RANK\""


def render(tmp_path: Path, capsys, text: str, *over: str) -> tuple[int, str, str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    spec = work / "job.yaml"
    spec.write_text(text)
    code = main(["render", str(spec), "--on", "skypilot", *over])
    out = capsys.readouterr()
    return code, out.out.replace(str(work), "$WORKDIR"), out.err


@pytest.mark.parametrize("launcher", ["native", "torchrun", "none"])
def test_render_matches_golden(launcher, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_super_secret_value")
    code, out, err = render(tmp_path, capsys, SPEC, "-o", f"launcher={launcher}")
    assert code == 0, err
    assert "hf_super_secret_value" not in out
    golden = GOLDEN / f"skypilot-{launcher}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out)
    assert out == golden.read_text()
    task = yaml.safe_load(out)
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert task["resources"]["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": 2,
    }
    assert task["secrets"] == {"HF_TOKEN": None}
    assert "FROM_SECRET" not in task["envs"] and 'export FROM_SECRET="${HF_TOKEN}"' in task["run"]
    validate_with_skypilot(tmp_path, out)


def validate_with_skypilot(tmp_path: Path, text: str) -> None:
    """SkyPilot's own parser: in this interpreter, or one named by TREB_SKYPILOT_PYTHON."""
    path = tmp_path / "task.yaml"
    path.write_text(text)
    probe = "import sky, sys; t = sky.Task.from_yaml(sys.argv[1]); print(t.num_nodes)"
    python = os.environ.get("TREB_SKYPILOT_PYTHON")
    if not python:
        try:
            import sky  # noqa: F401
        except ImportError:
            if in_ci():  # `make test` has it
                pytest.fail("CI: set TREB_SKYPILOT_PYTHON (make test builds .venv-sky)")
            pytest.skip("skypilot is not installed (pip install 'trebuchet[skypilot]')")
        python = sys.executable
    res = subprocess.run(
        [python, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("2"), res.stderr[-2000:]


@pytest.mark.parametrize(
    "spec,why",
    [
        ("command: x\ngpus_per_node: 8\n", "skypilot.accelerators: SkyPilot needs the GPU type"),
        ("command: x\ngpus_per_node: 8\nskypilot: {accelerators: 'A100:4'}\n", "asks for 4 GPUs"),
        ("command: x\nlauncher: mpirun\n", "launcher: mpirun is not rendered"),
        ("command: x\nenvironment: {image: img, mounts: ['/a:/a']}\n", "environment.mounts"),
    ],
)
def test_refused_with_exit_2(spec, why, tmp_path, capsys) -> None:
    code, out, err = render(tmp_path, capsys, spec)
    assert code == 2 and why in err and out == ""


def test_run_without_skypilot_installed_is_a_clear_exit_2(
    tmp_path, capsys, monkeypatch, treb_home
) -> None:
    monkeypatch.setitem(sys.modules, "sky", None)  # import sky -> ImportError
    spec = tmp_path / "job.yaml"
    spec.write_text("command: echo hi\n")
    assert main(["run", str(spec), "--on", "skypilot"]) == 2
    assert "pip install 'trebuchet[skypilot]'" in capsys.readouterr().err
    assert main(["ps", "--json"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == []  # nothing recorded


def run_script(tmp_path: Path, capsys, text: str, node: int, nodes: int = 2) -> tuple[int, Path]:
    code, out, err = render(tmp_path, capsys, text)
    assert code == 0, err
    task = yaml.safe_load(out)
    outdir = tmp_path / f"out-{node}"
    outdir.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "OUT": str(outdir),
        "SKYPILOT_NODE_RANK": str(node),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NODE_IPS": "10.1.0.7\n10.1.0.8",
        **{k: str(v) for k, v in task["envs"].items()},
    }
    res = subprocess.run(
        ["bash", "-c", task["run"]], env=env, capture_output=True, text=True, timeout=60
    )
    return res.returncode, outdir


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_native_run_script_starts_every_rank_with_the_contract_env(tmp_path, capsys) -> None:
    spec = 'command: env > "$OUT/$RANK"\nnodes: 2\nprocs_per_node: 3\nenv: {Q: "a\'b $(c)"}\n'
    code, outdir = run_script(tmp_path, capsys, spec, node=1)
    assert code == 0
    assert sorted(p.name for p in outdir.iterdir()) == ["3", "4", "5"]
    env = dict(
        line.split("=", 1) for line in (outdir / "4").read_text().splitlines() if "=" in line
    )
    for key, want in {
        "RANK": "4",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "NUM_NODES": "2",
        "MASTER_ADDR": "10.1.0.7",
        "MASTER_PORT": "29500",
        "Q": "a'b $(c)",
        "PYTHONUNBUFFERED": "1",
    }.items():
        assert env[key] == want, key
    assert env["TREB_CHECKPOINT_DIR"].endswith("/.trebuchet/runs/RUN_ID/checkpoints")


def test_hostile_command_is_carried_literally(tmp_path, capsys) -> None:
    spec = "command: " + yaml.safe_dump(HOSTILE).strip() + "\nprocs_per_node: 1\n"
    code, outdir = run_script(tmp_path, capsys, spec, node=0, nodes=1)
    assert code == 0
    assert (outdir / "0").read_text() == "it's\n$(whoami)\n`id`\na\nb\n"


def test_first_failed_rank_stops_the_others(tmp_path, capsys) -> None:
    spec = "command: 'if [ \"$LOCAL_RANK\" = 1 ]; then exit 3; fi; sleep 600'\nprocs_per_node: 3\n"
    code, _ = run_script(tmp_path, capsys, spec, node=0, nodes=1)  # 60 s limit: not waited for
    assert code == 3


def test_none_launcher_runs_once_per_node(tmp_path, capsys) -> None:
    spec = (
        "command: 'echo $NODE_RANK $NUM_NODES $MASTER_ADDR $LOCAL_WORLD_SIZE > $OUT/n'\n"
        "launcher: none\nnodes: 2\nprocs_per_node: 4\n"
    )
    code, outdir = run_script(tmp_path, capsys, spec, node=1)
    assert code == 0 and (outdir / "n").read_text() == "1 2 10.1.0.7 4\n"


def test_run_hands_the_task_to_skypilots_api(tmp_path, capsys, monkeypatch, treb_home) -> None:
    """A stand-in `sky` module records the calls: managed job, secrets from the shell."""
    import types

    calls: dict = {}

    class Task:
        @staticmethod
        def from_yaml_config(config, secrets_overrides=None):
            calls["config"], calls["secrets"] = config, secrets_overrides
            return "TASK"

    jobs = types.SimpleNamespace(
        launch=lambda task, name: calls.setdefault("launch", (task, name)) and "REQ",
        tail_logs=lambda job_id, follow: 0,
    )
    fake = types.SimpleNamespace(Task=Task, jobs=jobs, stream_and_get=lambda req: ([7], None))
    monkeypatch.setitem(sys.modules, "sky", fake)
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_shell_123")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: sky-run\ncommand: echo hi\nretries: 1\nsecrets: [HF_TOKEN]\n")
    assert main(["run", str(spec), "--on", "skypilot"]) == 0
    assert calls["secrets"] == [("HF_TOKEN", "hf_from_the_shell_123")]
    assert calls["config"]["secrets"] == {"HF_TOKEN": None}  # the task itself has no value
    assert calls["launch"][1].startswith("sky-run-")
    capsys.readouterr()
    assert main(["ps", "--json"]) == 0
    (run,) = yaml.safe_load(capsys.readouterr().out)
    assert run["state"] == "SUCCEEDED" and run["backend"] == "skypilot"


def test_nsys_wraps_every_rank_in_the_run_script(tmp_path, capsys, monkeypatch) -> None:
    """nsys cannot run here (no GPU stack): a stand-in records the report path and runs the rank."""
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nshift; while [ "$1" != -o ]; do shift; done; '
                    'echo "$2" >> "$OUT/calls"; shift 2; exec "$@"\n')  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    spec = (
        'command: echo ran > "$OUT/r$RANK"\nprocs_per_node: 2\nprofile: nsys\nprofile_ranks: [1]\n'
    )
    code, outdir = run_script(tmp_path, capsys, spec, node=0, nodes=1)
    assert code == 0 and sorted(p.name for p in outdir.iterdir()) == ["calls", "r0", "r1"]
    assert (outdir / "calls").read_text().strip().endswith("/profile/attempt-0/rank-1")
