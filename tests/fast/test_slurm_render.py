"""`treb render --on slurm`: golden scripts and job files (UPDATE_GOLDEN=1 rewrites),
quoting, refusals.

Why: the sbatch script is the product here; each pitfall users hit in hand-written scripts
(tasks per node by launcher, runtime expansion of $RANK, secrets, srun flags) must stay
handled, no spec value may break the script or run as code, and the script stays short
enough to review: the lifecycle is the runtime's (job.json holds the values it reads).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import needs_program
from trebuchet.backends.slurm.checks import slurm_seconds
from trebuchet.backends.slurm.script import env_value, warning_seconds
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


def _split(out: str) -> tuple[str, dict]:
    """`treb render --on slurm` output -> (the sbatch script, the job file's values)."""
    script, _, job = out.partition("\n# ---- ")
    return script, json.loads(job.split("\n", 1)[1])


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
    normal = re.sub(r"treb-runtime-\d+-[0-9a-f]{12}\.pyz", "treb-runtime-VERSION-HASH.pyz", normal)
    golden = GOLDEN / f"slurm-{kind}.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    script, _ = _split(out)
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    shellcheck = needs_program("shellcheck")
    # warnings and errors (an `info` such as SC2016 is the spec's literal '$value' on purpose)
    check = subprocess.run([shellcheck, "-s", "bash", "-S", "warning", "-"], input=script,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout


def test_a_two_line_spec_renders_a_short_readable_script(tmp_path: Path, treb_home: Path) -> None:
    rc, out, err = _render(tmp_path, "command: python train.py\nnodes: 2\n")
    assert rc == 0, err
    script, job = _split(out)
    assert len(out.splitlines()) <= 60, out  # the script and the job file it reads
    # the runtime is started from the run directory, named with its version and hash
    assert re.search(r'^TREB_RUNTIME="\$TREB_RUN_DIR"/treb-runtime-\d+-[0-9a-f]{12}\.pyz$',
                     script, re.M), script  # fmt: skip
    assert script.rstrip().endswith('controller "$TREB_RUN_DIR/job.json" 8< <(env -0)')
    assert job["command"] == ["bash", "-c", "python train.py"] and job["nodes"] == 2


def test_pitfalls_handled_in_the_script(tmp_path: Path, treb_home: Path) -> None:
    _, native, _ = _render(tmp_path, SPECS["native"])
    _, torch, _ = _render(tmp_path, SPECS["torchrun"])
    # seed 004: one task per rank with srun-native, one per node under torchrun
    assert "#SBATCH --ntasks-per-node=2\n" in native
    assert "#SBATCH --ntasks-per-node=1\n" in torch
    # cpus_per_task is per rank: a torchrun node task gets the whole node's share, and srun
    # gets it explicitly (22.05's srun no longer inherits it from sbatch)
    assert "#SBATCH --cpus-per-task=48\n" in torch and "--cpus-per-task=48" in torch
    # the command is argv in the job file: $RANK and ${SLURM_NODEID} expand on the node
    cmd = 'python train.py --lr ${LR:-0.1} "$RANK" --node ${SLURM_NODEID}'
    assert _split(native)[1]["command"] == ["bash", "-c", cmd]
    # secrets by name only; env values quoted; the secret reference expands in the job
    assert "export FROM_SECRET='Bearer '\"${HF_TOKEN}\"" in native
    assert "export QUOTED='it'\"'\"'s a $value; rm -rf /'" in native
    # timeout 2h is per attempt (the controller's, with its warning): --time covers the 7
    # attempts (retries 2, and the default policies' 4) x (2h + grace 30 s + 30 s), + 1 min
    assert "#SBATCH --time=14:08:00" in torch and "--signal" not in torch
    assert (_split(torch)[1]["timeout"], _split(torch)[1]["warning"]) == (7200, 60)
    # slurm.time is the whole job's limit: Slurm sends the checkpoint signal before it
    _, own, _ = _render(tmp_path, SPECS["torchrun"] + "  time: '3:00:00'\n")
    assert "#SBATCH --time=3:00:00" in own and "#SBATCH --signal=B:USR1@60" in own
    assert "#SBATCH --requeue" in torch and "#SBATCH --no-requeue" in native
    assert "--mpi=pmi2" in torch and "--mpi" not in native
    assert _split(native)[1]["master_port"] == 29511 and _split(torch)[1]["master_port"] is None


def test_time_covers_every_attempt_of_the_per_attempt_timeout(tmp_path: Path,
                                                              treb_home: Path) -> None:  # fmt: skip
    """--time from timeout alone: attempts x (timeout + grace + 30 s) + 60 s, in minutes;
    the attempts are retries + 1 and what the retry log policies may grant."""
    base = "command: sleep 60\ntimeout: 4s\n"
    for extra, time in (("", "00:05:00"), ("default_log_policies: false\n", "00:02:00"),
                        ("default_log_policies: false\nretries: 3\n", "00:04:00"),
                        ("slurm: {time: '1'}\n", "1")):  # fmt: skip
        rc, out, err = _render(tmp_path, base + extra)
        assert rc == 0 and f"#SBATCH --time={time}\n" in out, (extra, err, out)
        assert ("--signal" in out) == ("slurm:" in extra), out
        assert (_split(out)[1]["timeout"], _split(out)[1]["warning"]) == (4, 0.4)


@pytest.mark.parametrize(
    "written,rendered,warn",
    [("30m", "00:30:00", 60), ("1h30m", "01:30:00", 60), ("1.5h", "01:30:00", 60),
     ("2d", "2-00:00:00", 60), ("90s", "00:02:00", 12), ("04:00:00", "04:00:00", 60),
     ("30", "30", 60), ("unlimited", "unlimited", None)],
)  # fmt: skip
def test_slurm_time_takes_the_durations_timeout_takes(
    written: str, rendered: str, warn: int | None, tmp_path: Path, treb_home: Path
) -> None:
    """Issue 25: `slurm.time: 30m` was refused while `timeout: 30m` was accepted. A duration
    with units becomes Slurm's D-HH:MM:SS (whole minutes, as Slurm counts: the checkpoint
    signal's lead is 10 % of what Slurm enforces); Slurm's own forms go as written."""
    rc, out, err = _render(tmp_path, f"command: sleep 60\nslurm:\n  time: '{written}'\n")
    assert rc == 0, err
    assert f"#SBATCH --time={rendered}\n" in out, out
    assert (f"#SBATCH --signal=B:USR2@{warn}\n" in out) if warn else "--signal" not in out


@pytest.mark.parametrize("written,why", [("0m", "is not a duration"), ("30x", "is not a duration"),
                                         ("400d", "is more than 366 days")])  # fmt: skip
def test_slurm_time_refusals_name_the_line(written: str, why: str, tmp_path: Path,
                                           treb_home: Path) -> None:  # fmt: skip
    rc, _, err = _render(tmp_path, f"command: x\nslurm:\n  time: '{written}'\n")
    assert rc == 2 and "Traceback" not in err
    assert f"job.yaml:3: slurm.time: '{written}' {why}" in err, err


def test_mpirun_is_one_task_on_the_first_node(tmp_path: Path, treb_home: Path) -> None:
    _, out, _ = _render(tmp_path, SPECS["mpirun"])
    # one Slurm task per node in the allocation (its CPUs for all the node's ranks), and
    # the ranks' step is a single task on the first node: mpirun starts the rest
    assert "#SBATCH --ntasks-per-node=1\n" in out and "#SBATCH --cpus-per-task=8\n" in out
    job = _split(out)[1]
    assert job["srun"][:3] == ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]
    assert not any(a.startswith("--mpi") for a in job["srun"])  # slurm.mpi is srun's
    assert job["srun_hook"][:2] == ["--nodes=2", "--ntasks=2"]  # pre/post: every node
    assert job["mpi_env"] == ["HF_TOKEN", "NCCL_DEBUG"] and "hf_secret_value" not in out


def test_hostile_values_stay_literal(tmp_path: Path, treb_home: Path) -> None:
    text = (
        "name: h\ncommand: [python, x.py, " + _yaml(HOSTILE) + "]\nenv:\n  EVIL: "
        + _yaml(HOSTILE) + "\nslurm:\n  account: " + _yaml("acct$(id)`id`") + "\n"
    )  # fmt: skip
    rc, out, err = _render(tmp_path, text)
    assert rc == 0, err
    # Evaluating the generated env lines in bash gives back exactly the values.
    script, job = _split(out)
    env = script.split("# env from the spec")[1].split("\n", 1)[1].split("command -v")[0]
    probe = env + '\nprintf "%s" "$EVIL"'
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    # ${VAR} in env values expands at submission (the contract); never in the command
    expanded = HOSTILE.replace("${HOME}", os.environ["HOME"])
    assert res.stdout == expanded and job["command"] == ["python", "x.py", HOSTILE]
    assert not Path("/tmp/pwned").exists()
    assert '#SBATCH --account="acct$(id)`id`"' in out  # a comment to bash, a string to sbatch


def _yaml(value: str) -> str:
    import json

    return json.dumps(value)  # JSON strings are YAML strings


def test_a_tool_missing_here_warns_in_a_render_and_refuses_a_run(tmp_path: Path,
                                                                 treb_home) -> None:  # fmt: skip
    """A render is a dry run: the Python the venv needs (or conda) missing on this host is a
    warning; `treb run` refuses it (before looking for sbatch), with the field's line."""
    rc, out, err = _render(
        tmp_path, "name: x\ncommand: python t.py\nenvironment: {python: '3.2'}\n"
    )
    assert rc == 0 and out, err
    assert "treb render: warning: " in err and "job.yaml:3: environment.python: Python 3.2" in err
    res = subprocess.run(["python", "-m", "trebuchet", "run", str(tmp_path / "work" / "job.yaml"),
                          "--on", "slurm"], capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 2 and "job.yaml:3: environment.python: Python 3.2" in res.stderr


@pytest.mark.parametrize(
    "extra,why",
    [
        ("launcher: mpirun\nenvironment: {image: x}", "mpirun with a container image"),
        ("gpus_per_node: -1", "no Slurm equivalent"),
        ("checkpoint_signal: SIGTERM", "SIGTERM is what Slurm sends"),
        ("slurm: {sbatch_args: ['--ntasks-per-node=8']}", "use procs_per_node"),
        ("slurm: {sbatch_args: ['--export=NONE']}", "--export must keep ALL"),
        ('slurm: {sbatch_args: ["--comment=a\\n#SBATCH --x"]}', "one line"),
        ("slurm: {account: 'a\"b'}", "without double quotes"),
        ("slurm: {time: 'soon'}", "is not a duration (30m, 2h, 1h30m) or a Slurm time"),
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
    cmd = _split(out)[1]["command"]
    assert rc == 0 and cmd[:2] == ["bash", "-c"] and "nsys profile" in cmd[2] and "treb-nsys" in cmd


@pytest.mark.parametrize(
    "extra,inline",
    [
        ("", True),  # one node, one native rank: the controller runs it, no srun step
        ("launcher: none\nprocs_per_node: 4", True),
        ("procs_per_node: 2", False),
        ("nodes: 2", False),
        ("launcher: torchrun", False),
        ("slurm: {mpi: pmix}", False),  # PMI comes from srun
        ("environment: {image: x}", False),  # pyxis is an srun plugin
    ],
)
def test_which_jobs_run_their_only_task_in_the_batch_step(
    extra: str, inline: bool, tmp_path: Path, treb_home: Path
) -> None:
    rc, out, err = _render(tmp_path, f"name: x\ncommand: python t.py\n{extra}\n")
    assert rc == 0, err
    assert _split(out)[1]["inline"] is inline


def test_native_runs_one_node_agent_per_node_unless_srun_starts_each_rank(
    tmp_path: Path, treb_home: Path
) -> None:
    """Issue 36: srun starts one task per node (the node's agent, which starts its ranks
    itself) with the whole node's share of the allocation (`--whole`: its CPUs and GPUs,
    which the allocation holds per rank); with `slurm.mpi` (PMIx/PMI2 come from srun) it
    starts every rank as a task of its own, as before."""
    _, out, _ = _render(tmp_path, SPECS["native"])
    script, job = _split(out)
    assert "#SBATCH --ntasks-per-node=2\n" in script  # the allocation: 2 ranks' share a node
    assert job["srun"][:3] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert "--whole" in job["srun"] and not any(a.startswith("--cpus-per-task")
                                                 for a in job["srun"])  # fmt: skip
    _, out, _ = _render(tmp_path, SPECS["native"] + "  mpi: pmix\n")
    job = _split(out)[1]
    assert job["srun"][:3] == ["--nodes=2", "--ntasks=4", "--ntasks-per-node=2"]
    assert "--mpi=pmix" in job["srun"] and "--whole" not in job["srun"]
    assert "--cpus-per-task=4" in job["srun"]


@pytest.mark.parametrize(
    "extra,no_kill",
    [
        ("nodes: 2", True),  # one node agent per node: they park, a lost node ends no other
        ("nodes: 2\nlauncher: torchrun", True),
        ("nodes: 2\nlauncher: none", True),
        ("nodes: 2\npre: 'true'", False),  # pre/post: the agents do not park
        ("nodes: 2\nprocs_per_node: 2\nslurm: {mpi: pmix}", False),  # srun starts each rank
        ("nodes: 2\nlauncher: mpirun", False),
        ("", False),  # the job's only task runs in the batch step: no srun step
    ],
)
def test_the_rendered_srun_is_the_one_that_runs(
    extra: str, no_kill: bool, tmp_path: Path, treb_home: Path
) -> None:
    """`treb render` shows the ranks' srun flags as the controller runs them: `--no-kill`
    where the node agents park in their step (before, the controller added it at run
    time and the render did not show it)."""
    rc, out, err = _render(tmp_path, f"name: x\ncommand: python t.py\n{extra}\n")
    assert rc == 0, err
    job = _split(out)[1]
    assert ("--no-kill" in job["srun"]) is no_kill, job["srun"]
    assert "--no-kill" not in job["srun_hook"]  # pre/post steps end with their node
