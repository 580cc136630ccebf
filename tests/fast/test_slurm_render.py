"""`treb render --on slurm`: golden scripts (UPDATE_GOLDEN=1 rewrites), quoting, refusals.

Why: the sbatch script is the product here; each pitfall users hit in hand-written scripts
(tasks per node by launcher, runtime expansion of $RANK, secrets, srun flags) must stay
handled, and no spec value may break the script or run as code.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from trebuchet.backends.slurm_script import env_value, slurm_seconds, warning_seconds
from trebuchet.cli.main import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
HOSTILE = 'it\'s "q" $(touch /tmp/pwned) `id` ${HOME} \\ ; rm -rf /\nline2'
SPECS = {
    "native": """\
name: render-me
command: python train.py --lr ${LR:-0.1} "$RANK" --node ${SLURM_NODEID}
nodes: 2
procs_per_node: 2
master_port: 29511
secrets: [HF_TOKEN]
env:
  OMP_NUM_THREADS: 3
  QUOTED: "it's a $value; rm -rf /"
  FROM_SECRET: "Bearer ${HF_TOKEN}"
slurm:
  account: my-acct
  partition: batch
  qos: high
  constraint: "a100&ib"
  mem: 64G
  exclusive: true
  cpus_per_task: 4
  sbatch_args: ["--comment=hello world", "--mail-type=END"]
  setup: ["module load cuda/12.4", "source /shared/env.sh"]
""",
    "torchrun": """\
name: big
command: [python, -m, trainer, --config, "cfg a.yaml"]
launcher: torchrun
nodes: 4
gpus_per_node: 8
timeout: 2h
retries: 2
checkpoint_signal: USR1
grace_period: 30
slurm:
  cpus_per_task: 6
  mpi: pmi2
""",
    "mpirun": """\
name: with-mpirun
command: python train.py --rank "$RANK"
launcher: mpirun
nodes: 2
procs_per_node: 4
secrets: [HF_TOKEN]
env:
  NCCL_DEBUG: INFO
slurm:
  cpus_per_task: 2
  mpi: pmix
""",
    "none": """\
name: own-launcher
command: ./launch.sh
launcher: none
nodes: 2
procs_per_node: 4
pre: echo prepare on $(hostname)
post: echo done
slurm:
  time: "1-00:00:00"
  partition: long
""",
    "image": """\
name: in-a-container
command: python train.py
nodes: 2
gpus_per_node: 4
timeout: 30m
timeout_warning: 5m
environment:
  image: nvcr.io/nvidia/pytorch:24.05-py3
  mounts: ["/data:/data:ro", "/scratch:/scratch"]
slurm:
  mpi: pmix
""",
}


def _render(tmp_path: Path, text: str, *extra: str) -> tuple[int, str, str]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    spec = work / "job.yaml"
    spec.write_text(text)
    res = subprocess.run(
        ["python", "-m", "trebuchet", "render", str(spec), "--on", "slurm", *extra],
        capture_output=True, text=True, env={**os.environ, "HF_TOKEN": "hf_secret_value"},
    )  # fmt: skip
    return res.returncode, res.stdout, res.stderr


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_render_matches_golden(kind: str, tmp_path: Path, treb_home: Path) -> None:
    rc, out, err = _render(tmp_path, SPECS[kind])
    assert rc == 0, err
    assert "hf_secret_value" not in out
    normal = out.replace(str(treb_home), "$TREB_HOME").replace(str(tmp_path / "work"), "$WORKDIR")
    golden = GOLDEN / f"slurm-{kind}.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    check = subprocess.run(["bash", "-n"], input=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_pitfalls_handled_in_the_script(tmp_path: Path, treb_home: Path) -> None:
    _, native, _ = _render(tmp_path, SPECS["native"])
    _, torch, _ = _render(tmp_path, SPECS["torchrun"])
    # seed 004: one task per rank with srun-native, one per node under torchrun
    assert "#SBATCH --ntasks-per-node=2\n" in native
    assert "#SBATCH --ntasks-per-node=1\n" in torch
    # cpus_per_task is per rank: a torchrun node task gets the whole node's share, and srun
    # gets it explicitly (22.05's srun no longer inherits it from sbatch)
    assert "#SBATCH --cpus-per-task=48\n" in torch and "--cpus-per-task=48" in torch
    # the command is single-quoted: $RANK and ${SLURM_NODEID} expand on the node, at run time
    assert "'python train.py --lr ${LR:-0.1} \"$RANK\" --node ${SLURM_NODEID}'" in native
    # secrets by name only; env values quoted; the secret reference expands in the job
    assert "export FROM_SECRET='Bearer '\"${HF_TOKEN}\"" in native
    assert "export QUOTED='it'\"'\"'s a $value; rm -rf /'" in native
    # time limit, checkpoint signal before it, requeue allowed when retries remain
    assert "#SBATCH --time=02:00:00" in torch and "#SBATCH --signal=B:USR1@60" in torch
    assert "#SBATCH --requeue" in torch and "#SBATCH --no-requeue" in native
    assert "--mpi=pmi2" in torch and "--mpi" not in native
    assert "TREB_MASTER_PORT=29511" in native and "TREB_MASTER_PORT=''" in torch


def test_mpirun_is_one_task_on_the_first_node(tmp_path: Path, treb_home: Path) -> None:
    _, out, _ = _render(tmp_path, SPECS["mpirun"])
    # one Slurm task per node in the allocation (its CPUs for all the node's ranks), and
    # the ranks' step is a single task on the first node: mpirun starts the rest
    assert "#SBATCH --ntasks-per-node=1\n" in out and "#SBATCH --cpus-per-task=8\n" in out
    srun = re.search(r"^TREB_SRUN=\((.*)\)$", out, re.M)
    assert srun and srun.group(1).split()[:3] == ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
    assert "--mpi" not in srun.group(1)  # slurm.mpi is srun's, not mpirun's
    hook = re.search(r"^TREB_SRUN_HOOK=\((.*)\)$", out, re.M)
    assert hook and hook.group(1).startswith("--nodes=2 --ntasks=2")  # pre/post: every node
    assert "TREB_MPI_ENV='HF_TOKEN NCCL_DEBUG'" in out and "hf_secret_value" not in out


def test_mpirun_task_command_line(tmp_path: Path) -> None:
    """The runtime's mpirun line and each rank's mapping, with stand-ins for mpirun/scontrol."""
    from trebuchet.backends import slurm_runtime as rt
    from trebuchet.launcher.bash_helpers import HELPERS

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'tn1\\ntn2\\n'\n")
    # mpirun stand-in: print its argv, then run the rank command as OpenMPI rank 5 of 8
    (bin_dir / "mpirun").write_text(
        '#!/bin/bash\nprintf "%s\\0" "$@" > "$TREB_RUN_DIR/argv"\n'
        'while [ "$1" != bash ]; do shift; done\n'
        "OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 "
        'OMPI_COMM_WORLD_LOCAL_SIZE=4 exec "$@"\n'
    )  # fmt: skip
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "attempt-0").mkdir(parents=True)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "TREB_RUN_DIR": str(run_dir),
        "TREB_WORKDIR": str(tmp_path), "TREB_LAUNCHER": "mpirun", "TREB_PPN": "4",
        "TREB_ATTEMPT": "0", "TREB_GRACE": "1", "TREB_CHECKPOINT_SIGNAL": "SIGUSR2",
        "TREB_MPI_ENV": "MY_VAR", "MY_VAR": "x", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "1",
        "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "tn[1-2]", "SLURM_JOB_ID": "7",
        "MASTER_ADDR": "tn1", "MASTER_PORT": "15007",
        "TREB_TASK_SH": HELPERS + rt.TASK,
    }  # fmt: skip
    show = 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $NUM_NODES"'
    res = subprocess.run(
        ["bash", "-c", env["TREB_TASK_SH"], "treb-task", "task", "bash", "-c", show],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + (run_dir / "attempt-0" / "node-0.log").read_text()
    argv = (run_dir / "argv").read_text().split("\0")[:-1]
    assert "MY_VAR" in argv and argv[argv.index("MY_VAR") - 1] == "-x"
    assert argv[:8] == ["-np", "8", "-H", "tn1:4,tn2:4", "--bind-to", "none", "--map-by", "slot"]
    assert argv[8:11] == ["--mca", "odls_base_sigkill_timeout", "1"]  # grace_period
    assert "TREB_TASK_SH" in argv and argv[argv.index("bash") + 3 :] == [
        "treb-rank", "mpi", "bash", "-c", show]  # fmt: skip
    assert (run_dir / "attempt-0" / "rank-5.log").read_text() == "5 8 1 4 1 2\n"
    import json

    rec = json.loads((run_dir / "attempt-0" / "rank-5.json").read_text())
    assert (rec["rank"], rec["node"], rec["local_rank"], rec["label"]) == (5, 1, 1, "1:1")
    assert rec["exit_code"] == 0 and rec["state"] == "ENDED"
    node = json.loads((run_dir / "attempt-0" / "node-0.json").read_text())
    assert node["rank"] is None and node["exit_code"] == 0


def test_hostile_values_stay_literal(tmp_path: Path, treb_home: Path) -> None:
    text = (
        "name: h\ncommand: [python, x.py, " + _yaml(HOSTILE) + "]\nenv:\n  EVIL: "
        + _yaml(HOSTILE) + "\nslurm:\n  account: " + _yaml("acct$(id)`id`") + "\n"
    )  # fmt: skip
    rc, out, err = _render(tmp_path, text)
    assert rc == 0, err
    # Evaluating the generated value and env sections in bash gives back exactly the values.
    values = out.split("# ---- values from the spec")[1].split("# ---- trebuchet runtime")[0]
    env = out.split("# ---- env from the spec")[1].split("# ---- slurm.setup")[0]
    values, env = values.split("\n", 1)[1], env.split("\n", 1)[1]  # drop the marker lines
    probe = values + env + '\nprintf "%s\\0" "${TREB_CMD[@]}" "$EVIL"'
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # ${VAR} in env values expands at submission (the contract); never in the command
    expanded = HOSTILE.replace("${HOME}", os.environ["HOME"])
    assert res.stdout.split("\0")[:-1] == ["python", "x.py", HOSTILE, expanded]
    assert not Path("/tmp/pwned").exists()
    assert '#SBATCH --account="acct$(id)`id`"' in out  # a comment to bash, a string to sbatch


def _yaml(value: str) -> str:
    import json

    return json.dumps(value)  # JSON strings are YAML strings


@pytest.mark.parametrize(
    "extra,why",
    [
        ("launcher: mpirun\nenvironment: {image: x}", "mpirun with a container image"),
        ("environment: {python: '3.2'}", "Python 3.2 is not installed here"),
        ("gpus_per_node: -1", "no Slurm equivalent"),
        ("checkpoint_signal: SIGTERM", "SIGTERM is what Slurm sends"),
        ("slurm: {sbatch_args: ['--ntasks-per-node=8']}", "use procs_per_node"),
        ("slurm: {sbatch_args: ['--export=NONE']}", "--export must keep ALL"),
        ('slurm: {sbatch_args: ["--comment=a\\n#SBATCH --x"]}', "one line"),
        ("slurm: {account: 'a\"b'}", "without double quotes"),
        ("slurm: {time: 'soon'}", "is not a Slurm time"),
        ('slurm: {setup: ["a\\nb"]}', "one shell line per item"),
    ],
)
def test_refused_with_a_clear_error(extra: str, why: str, tmp_path: Path, treb_home) -> None:
    rc, out, err = _render(tmp_path, f"name: x\ncommand: python t.py\n{extra}\n")
    assert rc == 2 and out == "", err
    assert why in err and "Traceback" not in err
    assert re.search(r"job\.yaml(:\d+)?: ", err), err


def test_times_and_warnings() -> None:
    assert slurm_seconds("30") == 1800  # a bare number is minutes in Slurm
    assert slurm_seconds("10:30") == 630 and slurm_seconds("1:00:00") == 3600
    assert slurm_seconds("2-03") == 2 * 86400 + 3 * 3600
    assert slurm_seconds("UNLIMITED") is None

    class S:
        timeout_warning = None

    assert warning_seconds(S(), 7200) == 60 and warning_seconds(S(), 100) == 10
    assert warning_seconds(S(), None) is None
    S.timeout_warning = 300.0
    assert warning_seconds(S(), 120) == 120


def test_env_value_expands_only_declared_secrets() -> None:
    assert env_value("a ${TOK} b ${OTHER}", {"TOK"}) == "'a '\"${TOK}\"' b ${OTHER}'"
    assert env_value("${TOK}", {"TOK"}) == '"${TOK}"'
    assert env_value("", set()) == "''"


def test_main_renders_without_slurm_installed(tmp_path: Path, treb_home, capsys, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no sbatch: render still works
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ncommand: 'true'\n")
    assert main(["render", str(spec), "--on", "slurm"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash\n")


def test_venv_conda_and_profiles_reach_the_script(tmp_path: Path, treb_home) -> None:
    """Environments are built on the submitting host in TREB_HOME (shared with the nodes);
    the script puts a venv first on PATH, wraps ranks in `conda run`, and nsys-wraps them."""
    rc, out, err = _render(tmp_path, "name: x\ncommand: python t.py\nenvironment: {requirements: [six]}\n"
                           "profile: torch\nprofile_ranks: [0, 3]\n")  # fmt: skip
    assert rc == 0, err
    prefix = treb_home / "envs" / "x"
    assert f'export VIRTUAL_ENV={prefix} PATH={prefix}/bin:"$PATH"' in out
    assert "export TREB_TORCH_PROFILE_DIR=" in out and "export TREB_PROFILE_RANKS='0 3'" in out
    rc, out, err = _render(tmp_path, "name: x\ncommand: python t.py\nprofile: nsys\n")
    assert rc == 0 and "TREB_CMD=(bash -c " in out and "nsys profile" in out and "treb-nsys" in out
