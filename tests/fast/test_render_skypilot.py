"""`treb render --on skypilot`: golden task YAMLs, SkyPilot's own parser when available, and
the `run:` section executed here with SkyPilot's variables and the file_mounts' files in
place (tests/engine_nodes.py: no SkyPilot runs here), starting the node agent."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import in_ci, needs_program
from tests.engine_nodes import finish, load, sky_node, sky_task, spec_file, started
from trebuchet.cli.main import main
from trebuchet.launcher.runtime_file import archive

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
RUNTIME = re.compile(r"treb-runtime-\d+-[0-9a-f]{12}\.pyz")


def render(tmp_path: Path, capsys, text: str, *over: str) -> tuple[int, str, str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    spec = work / "job.yaml"
    spec.write_text(text)
    code = main(["render", str(spec), "--on", "skypilot", *over])
    out = capsys.readouterr()
    return code, out.out.replace(str(work), "$WORKDIR"), out.err


@pytest.mark.parametrize("launcher", ["native", "torchrun", "none"])
def test_render_matches_golden(launcher, tmp_path, capsys, monkeypatch, treb_home) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_super_secret_value")
    code, out, err = render(tmp_path, capsys, SPEC, "-o", f"launcher={launcher}")
    assert code == 0, err
    assert "hf_super_secret_value" not in out
    normal = RUNTIME.sub("treb-runtime-VERSION-HASH.pyz", out.replace(str(treb_home), "$TREB_HOME"))
    golden = GOLDEN / f"skypilot-{launcher}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    task = yaml.safe_load(out)
    assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
    assert task["resources"]["job_recovery"] == {
        "strategy": "EAGER_NEXT_REGION",
        "max_restarts_on_errors": 2,
    }
    assert task["secrets"] == {"HF_TOKEN": None}
    # an env value that uses a secret is expanded by the node agent, from job.json
    assert "FROM_SECRET" not in task["envs"] and "HF_TOKEN" not in task["run"]
    assert '#   "secret_env": {"FROM_SECRET": "${HF_TOKEN}"},' in out
    name = archive()[0]
    assert task["file_mounts"] == {
        f"~/.trebuchet/runtime/{name}": f"{treb_home}/runs/RUN_ID/{name}",
        "~/.trebuchet/runs/RUN_ID/job.json": f"{treb_home}/runs/RUN_ID/job.json",
    }
    assert not (treb_home / "runs" / "RUN_ID").exists()  # render writes nothing there
    assert len(task["run"].splitlines()) <= 8  # the head, a venv, the agent's start
    shellcheck = needs_program("shellcheck")
    check = subprocess.run([shellcheck, "-s", "bash", "-S", "warning", "-"], input=task["run"],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout
    # SkyPilot parses a task whose file_mounts sources do not exist yet; it checks them when
    # it launches (Task.validate), after `treb run` has written them (the test below).
    (line,) = validate_with_skypilot(tmp_path, [out])
    assert line.startswith("2 file_mounts:") and f"runs/RUN_ID/{name}' does not exist" in line


SKY_PROBE = """
import sys, sky
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    try:
        task.expand_and_validate_file_mounts()  # what sky.launch checks of file_mounts
        print(task.num_nodes, "ok")
    except ValueError as exc:
        print(task.num_nodes, "file_mounts:", exc)
"""


def validate_with_skypilot(tmp_path: Path, texts: list[str]) -> list[str]:
    """SkyPilot's own parser on each task (in this interpreter, or one named by
    TREB_SKYPILOT_PYTHON), then its check of the file_mounts: one line per task."""
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"task-{i}.yaml")
        paths[-1].write_text(text)
    python = os.environ.get("TREB_SKYPILOT_PYTHON")
    if not python:
        try:
            import sky  # noqa: F401
        except ImportError:
            if in_ci():  # `make test` has it
                pytest.fail("CI: set TREB_SKYPILOT_PYTHON (make test builds .venv-sky)")
            pytest.skip("skypilot is not installed (pip install 'trebuchet[skypilot]')")
        python = sys.executable
    res = subprocess.run([python, "-c", SKY_PROBE, *map(str, paths)], capture_output=True,
                         text=True, timeout=180)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()


def test_submitted_task_ships_the_runtime_and_job_file(tmp_path: Path, treb_home: Path) -> None:
    """What `treb run` hands over: file_mounts whose sources exist in the run directory
    (SkyPilot's own check passes), the runtime archive and the job file the node reads;
    with one source missing, SkyPilot's check fails (so the check is real)."""
    from trebuchet.importers.common import dump_yaml

    path = spec_file(tmp_path / "work", "command: python t.py\nnodes: 2\n")
    run_dir = tmp_path / "run"
    task = sky_task(load(path), run_dir)
    name, data = archive()
    assert (run_dir / name).read_bytes() == data
    job = json.loads((run_dir / "job.json").read_text())
    assert job["command"] == ["bash", "-c", "python t.py"] and job["launcher"] == "native"
    assert job["run_id"] == "r1" and job["nodes"] == 2 and job["timeout"] is None
    broken = dict(task, file_mounts={**task["file_mounts"], "~/x": str(tmp_path / "absent")})
    lines = validate_with_skypilot(tmp_path, [dump_yaml(task), dump_yaml(broken)])
    assert lines[0] == "2 ok"
    assert lines[1].startswith("2 file_mounts:") and "does not exist" in lines[1]


@pytest.mark.parametrize(
    "spec,why",
    [
        (
            "command: x\ngpus_per_node: 8\n",
            "job.yaml:2: gpus_per_node: SkyPilot needs the GPU type, e.g. skypilot.accelerators",
        ),
        (
            "command: x\nskypilot: {accelerators: 'A100:4'}\ngpus_per_node: 8\n",
            "job.yaml:2: skypilot.accelerators: A100:4 asks for 4 GPUs",
        ),
        (
            "command: x\nskypilot: {accelerators: 'A 100'}\n",
            "job.yaml:2: skypilot.accelerators: 'A 100' is not NAME or NAME:COUNT",
        ),
        ("command: x\nlauncher: mpirun\n", "job.yaml:2: launcher: mpirun is not rendered"),
        ("command: x\ngpus_per_node: -1\n", "job.yaml:2: gpus_per_node: -1 (all visible)"),
        (
            "command: x\nenvironment: {image: img, mounts: ['/a:/a']}\n",
            "job.yaml:2: environment.mounts: SkyPilot cannot bind-mount",
        ),
        (
            "command: x\nskypilot: {checkpoint_bucket: 's3://b', checkpoint_store: gcs}\n",
            "job.yaml:2: skypilot.checkpoint_store: only for a bucket given by name",
        ),
        ("command: x\nskypilot: {checkpoint_store: gcs}\n", "needs skypilot.checkpoint_bucket"),
        (
            "command: x\nskypilot: {checkpoint_bucket: 'no spaces'}\n",
            "job.yaml:2: skypilot.checkpoint_bucket",
        ),
        (
            "command: x\nskypilot: {checkpoint_bucket: ckpt-b1, checkpoint_store: ftp}\n",
            "job.yaml:2: skypilot.checkpoint_store",
        ),
        (
            "command: x\nenvironment: {requirements: ../r.txt}\n",
            "job.yaml:2: environment.requirements: ",
        ),
    ],
)
def test_refused_with_exit_2(spec, why, tmp_path, capsys) -> None:
    (tmp_path / "r.txt").write_text("torch\n")  # outside the workdir
    code, out, err = render(tmp_path, capsys, spec)
    assert code == 2 and why in err and out == "", err


def test_checkpoint_bucket_is_mounted_where_the_checkpoints_go(tmp_path, capsys) -> None:
    """A bucket URL (existing bucket) or a name (SkyPilot creates it, store as asked), in
    MOUNT mode at /treb-checkpoints; job.json points TREB_CHECKPOINT_DIR at the run's
    folder there. SkyPilot's own parser reads both tasks."""
    outs = []
    for over in (
        ["-o", "skypilot.checkpoint_bucket=s3://team-ckpt/digits"],
        ["-o", "skypilot.checkpoint_bucket=team-ckpt", "-o", "skypilot.checkpoint_store=gcs"],
    ):
        code, out, err = render(tmp_path, capsys, "command: x\nretries: 1\n", *over)
        assert code == 0, err
        outs.append(out)
    url, named = (yaml.safe_load(o)["file_mounts"]["/treb-checkpoints"] for o in outs)
    assert url == {"source": "s3://team-ckpt/digits", "mode": "MOUNT"}
    assert named == {"name": "team-ckpt", "mode": "MOUNT", "persistent": True, "store": "gcs"}
    assert '#   "checkpoint_dir": "/treb-checkpoints/RUN_ID",' in outs[0]
    for line in validate_with_skypilot(tmp_path, outs):
        assert line.startswith("1 "), line  # parsed; only the unwritten run dir is missing


def test_node_agent_puts_checkpoints_in_the_mounted_bucket(tmp_path) -> None:
    """The node (stand-in: the bucket's mount point is a folder here) gives every rank
    TREB_CHECKPOINT_DIR in the bucket, per run."""
    path = spec_file(tmp_path / "work", 'command: echo "$TREB_CHECKPOINT_DIR" > "$OUT/c"\n'
                     "skypilot: {checkpoint_bucket: ckpt-b1}\n")  # fmt: skip
    task = sky_task(load(path), tmp_path / "run")
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    assert job["checkpoint_dir"] == "/treb-checkpoints/r1"
    outdir = tmp_path / "out"
    outdir.mkdir()
    bucket = tmp_path / "bucket"
    job["checkpoint_dir"] = str(bucket / "r1")  # where the stand-in mounted it
    (tmp_path / "run" / "job.json").write_text(json.dumps(job))
    with started(sky_node(task, tmp_path / "home", 0, 1, "10.0.0.1", {"OUT": str(outdir)})) as (
        proc,
    ):
        rc, out, err = finish(proc, timeout=60)
    assert rc == 0, out + err
    assert (outdir / "c").read_text() == f"{bucket / 'r1'}\n" and (bucket / "r1").is_dir()


def test_the_example_renders_with_its_environment_for_the_nodes(tmp_path, capsys) -> None:
    """examples/digits-ddp as a new user tries it: its environment (bare_nodes_only) is the
    task's setup, pip installing the pinned requirements.txt; `treb check` is clean of
    node-environment-missing, and the same spec locally builds nothing."""
    example = Path(__file__).resolve().parents[2] / "examples" / "digits-ddp" / "job.yaml"
    over = ["-o", "gpus_per_node=2", "-o", "skypilot.accelerators=H100:2", "-o", "nodes=2"]
    assert main(["render", str(example), "--on", "skypilot", *over]) == 0
    task = yaml.safe_load(capsys.readouterr().out)
    assert "python -m pip install -r requirements.txt" in task["setup"]
    assert task["resources"]["accelerators"] == "H100:2"
    assert "torch==" in (example.parent / "requirements.txt").read_text()
    assert main(["check", str(example), "--on", "skypilot", "--json", *over]) in (0, 1)
    ids = [f["id"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert "node-environment-missing" not in ids and "gpus-unused" not in ids
    from trebuchet.envs.recipe import recipe_for

    assert recipe_for(load(example).spec, example.parent, "none") is None  # local, Slurm
    assert validate_with_skypilot(tmp_path, [yaml.safe_dump(task)])[0].startswith("2 ")


@pytest.mark.parametrize(
    "extra,over,want",
    [
        ("", [], ["node-environment-missing"]),
        ("environment: {requirements: requirements.txt}\n", [], []),
        ("environment: {image: 'nvcr.io/nvidia/pytorch:24.05-py3'}\n", [], []),
        (
            "environment: {requirements: requirements.txt}\nretries: 2\n",
            [],
            ["checkpoints-node-local"],
        ),
        (
            "environment: {requirements: requirements.txt}\nskypilot: {use_spot: true}\n",
            [],
            ["checkpoints-node-local"],
        ),
        (
            "environment: {requirements: requirements.txt}\nretries: 2\n",
            ["-o", "skypilot.checkpoint_bucket=s3://b"],
            [],
        ),
        (
            "environment: {requirements: requirements.txt}\nprocs_per_node: 2\n",
            ["-o", "skypilot.accelerators=H100:8"],
            ["gpus-unused"],
        ),
        (
            "environment: {requirements: requirements.txt}\nprocs_per_node: 2\ngpus_per_node: 8\n",
            ["-o", "skypilot.accelerators=H100:8"],
            [],
        ),
        (
            "environment: {requirements: requirements.txt}\n",
            ["-o", "skypilot.accelerators=H100:1"],
            [],
        ),
    ],
)
def test_check_warns_what_bare_nodes_would_lack(extra, over, want, tmp_path, capsys,
                                                monkeypatch) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "sky", None)  # backend-refuses is not what is tested
    work = tmp_path / "work"
    work.mkdir()
    (work / "requirements.txt").write_text("torch==2.13.0\n")
    (work / "train.py").write_text("import os\nimport torch\ntry:\n    import trebuchet\n"
                                   "except ImportError:\n    pass\n")  # fmt: skip
    (work / "job.yaml").write_text("command: python train.py\n" + extra)
    main(["check", str(work / "job.yaml"), "--on", "skypilot", "--json", *over])
    found = json.loads(capsys.readouterr().out)["findings"]
    ids = [f["id"] for f in found if f["id"] != "backend-refuses"]
    assert ids == want, found
    if want == ["node-environment-missing"]:
        (f,) = [f for f in found if f["id"] == want[0]]
        assert "imports torch and the workdir has requirements.txt" in f["message"]
        assert "trebuchet" not in f["message"]  # an optional import (in a try)


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


def run_script(tmp_path: Path, text: str, node: int, nodes: int = 2) -> tuple[int, Path, str]:
    """The `run:` section of one node, as SkyPilot runs it (tests/engine_nodes.py);
    (exit code, $OUT, the node's output)."""
    task = sky_task(load(spec_file(tmp_path / "work", text)), tmp_path / "run")
    outdir = tmp_path / f"out-{node}"
    outdir.mkdir()
    env = {"OUT": str(outdir)}
    ips = "10.1.0.7\n10.1.0.8"
    with started(sky_node(task, tmp_path / f"home-{node}", node, nodes, ips, env)) as (proc,):
        rc, out, err = finish(proc, timeout=60)
    return rc, outdir, out + err


def test_native_run_script_starts_every_rank_with_the_contract_env(tmp_path) -> None:
    spec = 'command: env > "$OUT/$RANK"\nnodes: 2\nprocs_per_node: 3\nenv: {Q: "a\'b $(c)"}\n'
    code, outdir, out = run_script(tmp_path, spec, node=1)
    assert code == 0, out
    assert sorted(p.name for p in outdir.iterdir()) == ["3", "4", "5"]
    env = dict(
        line.split("=", 1) for line in (outdir / "4").read_text().splitlines() if "=" in line
    )
    for key, want in {
        "RANK": "4",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "3",
        "GROUP_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "NUM_NODES": "2",
        "MASTER_ADDR": "10.1.0.7",
        "MASTER_PORT": "29500",
        "Q": "a'b $(c)",
        "PYTHONUNBUFFERED": "1",
        "TREB_RUN_ID": "r1",
        "TREB_ATTEMPT": "0",
    }.items():
        assert env[key] == want, key
    run_dir = tmp_path / "home-1" / ".trebuchet" / "runs" / "r1"
    assert env["TREB_RUN_DIR"] == str(run_dir)
    assert env["TREB_CHECKPOINT_DIR"] == str(run_dir / "checkpoints")
    assert (run_dir / "checkpoints").is_dir() and int(env["OMP_NUM_THREADS"]) >= 1


def test_hostile_command_is_carried_literally(tmp_path) -> None:
    spec = "command: " + yaml.safe_dump(HOSTILE).strip() + "\nprocs_per_node: 1\n"
    code, outdir, out = run_script(tmp_path, spec, node=0, nodes=1)
    assert code == 0, out
    assert (outdir / "0").read_text() == "it's\n$(whoami)\n`id`\na\nb\n"


def test_first_failed_rank_stops_the_others(tmp_path) -> None:
    spec = "command: 'if [ \"$LOCAL_RANK\" = 1 ]; then exit 3; fi; sleep 600'\nprocs_per_node: 3\n"
    code, _, out = run_script(tmp_path, spec, node=0, nodes=1)  # 60 s limit: not waited for
    assert code == 3, out


def test_none_launcher_runs_once_per_node(tmp_path) -> None:
    spec = (
        "command: 'echo $NODE_RANK $NUM_NODES $MASTER_ADDR $LOCAL_WORLD_SIZE > $OUT/n'\n"
        "launcher: none\nnodes: 2\nprocs_per_node: 4\n"
    )
    code, outdir, out = run_script(tmp_path, spec, node=1)
    assert code == 0 and (outdir / "n").read_text() == "1 2 10.1.0.7 4\n", out


def test_secret_in_an_env_value_is_expanded_on_the_node(tmp_path) -> None:
    """SkyPilot gives the node the secret by name; the agent expands the env value that uses
    it (job.json names the secret, never its value)."""
    spec = 'command: echo "$AUTH" > $OUT/auth\nsecrets: [TOK]\nenv: {AUTH: "Bearer ${TOK}"}\n'
    task = sky_task(load(spec_file(tmp_path / "work", spec)), tmp_path / "run")
    assert (
        "AUTH" not in task["envs"] and "hunter2" not in (tmp_path / "run" / "job.json").read_text()
    )
    outdir = tmp_path / "out"
    outdir.mkdir()
    env = {"OUT": str(outdir), "TOK": "hunter2"}
    with started(sky_node(task, tmp_path / "home", 0, 1, "10.0.0.1", env)) as (proc,):
        rc, out, err = finish(proc, timeout=60)
    assert rc == 0 and (outdir / "auth").read_text() == "Bearer hunter2\n", out + err
    del env["TOK"]  # SkyPilot did not get the secret: the node says so, exit 2
    with started(sky_node(task, tmp_path / "home", 0, 1, "10.0.0.1", env)) as (proc,):
        rc, out, err = finish(proc, timeout=60)
    assert rc == 2 and "secret TOK not in this node's environment" in err


def test_node_without_python3_says_so(tmp_path) -> None:
    task = sky_task(load(spec_file(tmp_path / "work", "command: 'true'\n")), tmp_path / "run")
    bin_dir = tmp_path / "bin"  # bash and head, no python3
    bin_dir.mkdir()
    for tool in ("bash", "head", "hostname"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    with started(sky_node(task, tmp_path / "home", 0, 1, "10.0.0.1", path=str(bin_dir))) as (p,):
        rc, out, err = finish(p, timeout=60)
    assert rc == 127 and "treb: no python3 (>= 3.8) on " in err and "the node agent needs it" in err


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


def test_nsys_wraps_every_rank_in_the_run_script(tmp_path, monkeypatch) -> None:
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
    code, outdir, out = run_script(tmp_path, spec, node=0, nodes=1)
    assert code == 0 and sorted(p.name for p in outdir.iterdir()) == ["calls", "r0", "r1"], out
    assert (outdir / "calls").read_text().strip().endswith("/profile/attempt-0/rank-1")
