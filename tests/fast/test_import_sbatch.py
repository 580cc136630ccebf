"""`treb import sbatch`: seed 004's Megatron Bridge templates, seed 003's script, hand-written
edge cases; every imported spec loads, every dropped part is reported with its line."""

from __future__ import annotations

import re

import pytest

from tests.fast.import_helpers import ENVIRON, FIXTURES, imported, notes_at, run_import
from trebuchet.spec.load import load_spec

SBATCH = sorted(p.name for p in FIXTURES.glob("*.sbatch"))


@pytest.mark.parametrize("name", SBATCH)
def test_every_fixture_imports_to_a_spec_that_loads(name, capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", name)
    assert loaded.spec.command
    for line in err:  # every note names the file and a line (or the file as a whole)
        assert line.startswith(f"treb import: {FIXTURES / name}"), line


def test_seed_003_script_torchrun_in_bash_c(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", "databricks-llama-sft.sbatch")
    spec = loaded.spec
    assert (spec.name, spec.launcher, spec.nodes, spec.gpus_per_node) == (
        "llama-sft",
        "torchrun",
        2,
        8,
    )
    assert spec.ranks_per_node == 8 and spec.master_port == 29500
    assert spec.command == "python train.py"
    assert spec.slurm.time == "02:00:00"
    assert any("--node-rank" in e and "sets the node rank" in e for e in notes_at(err, 10))


def test_seed_004_srun_native(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", "megatron-native.sbatch")
    spec = loaded.spec
    assert spec.launcher == "native" and spec.ranks_per_node == 8 and spec.gpus_per_node == 8
    # $WORKDIR substituted from the script, the rest kept for the node's shell
    # the task's `bash -c "..."` as srun ran it: its <placeholders> are not bash until
    # filled in, so the body stays quoted (the old import left them unquoted: bash -n failed)
    assert spec.command == (
        "bash -c 'cd /opt/Megatron-Bridge && uv sync && uv run --no-sync python <script.py> <args>'"
    )
    assert spec.environment.image == "<PATH_TO_YOUR_CONTAINER>.sqsh"
    assert spec.environment.mounts == [
        "<SHARED_FS>:<SHARED_FS>",
        "<PATH_TO_MEGATRON_BRIDGE>:/opt/Megatron-Bridge",
        "<PATH_TO_DATA>:/opt/data",
    ]
    assert spec.slurm.mpi == "pmix" and spec.slurm.exclusive is True
    assert (spec.slurm.time, spec.slurm.partition) == ("00:30:00", "batch")
    assert spec.secrets == ["GH_TOKEN", "HF_TOKEN"]
    assert spec.env["NCCL_NVLS_ENABLE"] == "0" and spec.env["HF_HOME"] == "<SHARED_FS>/HF_HOME"
    # the phase-1 srun stays in the batch script, as bash ran it (variables expanded)
    setup = spec.slurm.setup
    assert setup[-1].startswith(
        "srun --mpi=pmix -N 1 --ntasks=1 '--container-image=<PATH_TO_YOUR_CONTAINER>.sqsh'"
    )
    assert setup[-1].endswith("bash -c 'cd /opt/Megatron-Bridge && uv sync'")
    assert all("\n" not in s for s in setup)
    assert any("--nodes=<NNODES>" in e and "not carried over" in e for e in notes_at(err, 6))
    assert any("--output=" in e for e in notes_at(err, 12))
    assert any("--no-container-mount-home" in e for e in notes_at(err, 37))


@pytest.mark.parametrize(
    "name,script",
    [
        (
            "megatron-bridge.sbatch",
            "scripts/training/run_recipe.py --recipe '<recipe_name>' "
            "model.tensor_model_parallel_size=1 "
            "model.pipeline_model_parallel_size=1 ...overrides...",
        ),
        (
            "megatron-mlm.sbatch",
            "3rdparty/Megatron-LM/pretrain_gpt.py --tensor-model-parallel-size"
            " 1 --pipeline-model-parallel-size 1 ...args...",
        ),
    ],
)
def test_seed_004_torch_distributed_run_inside_train_cmd(name, script, capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", name)
    spec = loaded.spec
    assert spec.launcher == "torchrun" and spec.ranks_per_node == 8
    assert spec.command.endswith("uv run python " + script)
    # \$WANDB_API_KEY was escaped in TRAIN_CMD: a runtime reference, and a secret by name
    assert 'wandb login "${WANDB_API_KEY}"' in spec.command
    assert set(spec.secrets) == {"GH_TOKEN", "HF_TOKEN", "WANDB_API_KEY"}
    assert "torch.distributed.run" not in spec.command and "SLURM_NODEID" not in spec.command
    if name == "megatron-mlm.sbatch":  # bash evaluated the prefix: an env entry of the ranks
        assert spec.env["PYTHONPATH"] == "/opt/Megatron-Bridge/3rdparty/Megatron-LM:"
    assert spec.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # exported inside TRAIN_CMD
    joined = "\n".join(err)
    assert "grep" in joined and "after the main srun" in joined


def test_seed_004_full_template_no_torchrun_is_native_one_rank_per_node(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", "megatron-template.sbatch")
    spec = loaded.spec
    assert spec.launcher == "native" and spec.ranks_per_node == 1 and spec.gpus_per_node == 8
    # the task's `bash -c "$TRAIN_CMD"` as srun ran it (the body holds the template's
    # secret exports, so it stays quoted inside bash -c)
    assert spec.command.startswith("bash -c ")
    assert "cd /opt/Megatron-Bridge && uv sync && <TRAINING_COMMAND_HERE>" in spec.command
    assert any("placeholders kept" in e and "<TRAINING_COMMAND_HERE>" in e for e in err)


def test_short_forms_several_options_per_line_and_secrets(capsys, tmp_path) -> None:
    out, errtext, code = run_import(capsys, "sbatch", "short-forms.sbatch")
    assert code == 0
    for value in ("hf_abcdefghijklmnopqrstuvwxyz0123", "0123456789abcdef0123456789abcdef01234567"):
        assert value not in out and value not in errtext  # never printed
    data, err, loaded = imported(capsys, tmp_path, "sbatch", "short-forms.sbatch")
    spec = loaded.spec
    assert (spec.name, spec.nodes, spec.gpus_per_node, spec.launcher) == (
        "my-job",
        2,
        8,
        "torchrun",
    )
    sl = spec.slurm
    assert (sl.time, sl.partition, sl.account, sl.qos, sl.constraint) == (
        "01:30:00",
        "gpu",
        "proj42",
        "normal",
        "h100",
    )
    assert sl.cpus_per_task == 1  # -c 12 per torchrun task = 1 per rank (8 ranks)
    assert sl.sbatch_args == ["--mail-type=END"]
    assert sl.setup == [
        "module purge",
        "module load cuda/12.4 nccl",
        "source /shared/venvs/train/bin/activate",
    ]
    assert spec.secrets == ["HF_TOKEN", "WANDB_API_KEY"]
    assert spec.env["NCCL_DEBUG"] == "INFO"
    # \" and \$ inside double quotes are undone; nothing in the value is expanded
    assert spec.env["RUN_TAG"] == 'it\'s "quoted" $(not run) ${NOT_EXPANDED}'
    # the argv the task's bash gave torchrun's worker: "$RUN_TAG" as its value, one
    # argument, quoted; the exported credential a reference, never its value
    assert spec.command == (
        "python train.py --lr 3e-4 --tag 'it'\"'\"'s \"quoted\" $(not run) ${NOT_EXPANDED}'"
        ' --hf "${HF_TOKEN}"'
    )
    assert spec.environment.image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert spec.environment.mounts == ["/data:/data", "/ckpt:/ckpt"]
    assert (spec.checkpoint_signal, spec.timeout_warning) == ("SIGUSR1", 120)
    assert loaded.workdir == FIXTURES  # --chdir=. relative to the script
    assert any("--max-restarts=3" in e and "not carried over" in e for e in notes_at(err, 22))


def test_native_srun_with_quoted_args_and_missing_chdir(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "sbatch", "native.sbatch")
    spec = loaded.spec
    assert spec.launcher == "native" and spec.nodes == 4 and spec.ranks_per_node == 8
    assert spec.command == (
        "cd /nonexistent/cluster/path && python train.py --data "
        "'/data/my set' --out \"${SLURM_JOB_ID}\""
    )
    assert spec.slurm.mpi == "pmi2" and spec.slurm.mem == "0"
    assert any("--requeue" in e for e in notes_at(err, 5))
    assert any("SLURM_JOB_ID" in e for e in notes_at(err, 7))


def test_hostile_values_are_carried_literally(capsys, tmp_path) -> None:
    script = tmp_path / "hostile.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=2\n"
        "export NOTE='a \"b\" $(rm -rf /) `id` ${X}'\n"
        "srun python t.py --msg 'it'\\''s $(whoami) `id`' --x \"$(date)\"\n"
    )
    from trebuchet.cli.main import main

    assert main(["import", "sbatch", str(script)]) == 0
    out = capsys.readouterr().out
    (tmp_path / "job.yaml").write_text(out)
    from trebuchet.spec.load import load_spec

    spec = load_spec(tmp_path / "job.yaml", environ={}).spec
    assert spec.env["NOTE"] == 'a "b" $(rm -rf /) `id` ${X}'
    # $(date) ran in the batch script (in the sandbox): its value, quoted, is the argument
    assert spec.command.startswith("python t.py --msg 'it'\"'\"'s $(whoami) `id`' --x '")


def test_errors_are_exit_2_with_a_line(capsys, tmp_path) -> None:
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\nsrun bash -c 'unterminated\n")
    from trebuchet.cli.main import main

    assert main(["import", "sbatch", str(bad)]) == 2
    assert re.search(r"bad.sbatch:2: cannot read the script", capsys.readouterr().err)
    assert main(["import", "sbatch", str(tmp_path / "missing.sbatch")]) == 2


SLURM_KEYS = ("nodes", "ntasks-per-node", "gpus-per-node", "time", "partition", "account")
# What each original asks Slurm for (the template's --nodes=<NNODES> is not a request).
ORIGINAL = {
    "databricks-llama-sft.sbatch": {
        "nodes": "2",
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "time": "02:00:00",
    },
    "megatron-native.sbatch": {
        "ntasks-per-node": "8",
        "gpus-per-node": "8",
        "time": "00:30:00",
        "account": "<YOUR_ACCOUNT>",
        "partition": "batch",
    },
    "megatron-template.sbatch": {
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "time": "00:30:00",
        "account": "<YOUR_ACCOUNT>",
        "partition": "batch",
    },
    "megatron-bridge.sbatch": {
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "time": "00:30:00",
        "account": "<YOUR_ACCOUNT>",
        "partition": "batch",
    },
    "megatron-mlm.sbatch": {
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "time": "00:30:00",
        "account": "<YOUR_ACCOUNT>",
        "partition": "batch",
    },
    "short-forms.sbatch": {
        "nodes": "2",
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "time": "01:30:00",
        "partition": "gpu",
        "account": "proj42",
    },
    "native.sbatch": {
        "nodes": "4",
        "ntasks-per-node": "8",
        "gpus-per-node": "8",
        "time": "2-00:00:00",
        "partition": "batch",
        "account": "ml",
    },
}


@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_imported_spec_renders_to_the_same_slurm_request(
    name, capsys, tmp_path, treb_home, monkeypatch
) -> None:
    for secret in ("HF_TOKEN", "GH_TOKEN", "WANDB_API_KEY"):
        monkeypatch.setenv(secret, "x")
    data, err, loaded = imported(capsys, tmp_path, "sbatch", name)
    from trebuchet.cli.main import main

    assert main(["render", str(tmp_path / "job.yaml"), "--on", "slurm"]) == 0, (
        capsys.readouterr().err
    )
    script = capsys.readouterr().out
    asked = dict(re.findall(r"^#SBATCH --([a-z-]+)=(.*)$", script, re.M))
    want = ORIGINAL[name]
    for key in SLURM_KEYS:
        if key in want:
            assert asked.get(key, "").strip('"') == want[key], (key, asked)
    if (
        name != "databricks-llama-sft.sbatch"
        and name != "short-forms.sbatch"
        and name != "native.sbatch"
    ):
        assert "nodes" not in want  # <NNODES>: reported, and the spec asks for 1


SPLIT_SCRIPT = r"""#!/bin/bash
#SBATCH --nodes=1
GPT_ARGS="--num-layers 24 --hidden-size 2048
  --lr 1e-4"
DATA_ARGS="	--data-path /data/my file   --split 949,50,1 "
OUT_ARGS="--save $CKPT_DIR --log-interval 10"
SUB="$(echo sub one)"
EMPTY=
SRUN_ARGS="--ntasks-per-node=2  --mpi=pmix"
srun $SRUN_ARGS printf '<%s>\n' pretrain_gpt.py $GPT_ARGS $DATA_ARGS "$OUT_ARGS" \
  $OUT_ARGS $EMPTY "$EMPTY" x${DATA_ARGS}y "a $GPT_ARGS" $SUB $UNSET_ONE "${GPT_ARGS}"
"""


def test_unquoted_expansions_split_as_bash_splits_them(capsys, tmp_path, monkeypatch) -> None:
    """bash is the oracle: the script's srun line (srun replaced by a function that drops
    its options) and the imported command print the same argv, one `<arg>` per line.
    Variables the script reads from the submitting shell take its value at import, as
    sbatch takes them at submission (the report names each)."""
    import os
    import subprocess

    script = tmp_path / "megatron.sbatch"
    script.write_text(SPLIT_SCRIPT)
    monkeypatch.setenv("CKPT_DIR", "/ck pt")
    monkeypatch.setenv("UNSET_ONE", "u1 u2")
    out, errtext, code = run_import(capsys, "sbatch", str(script))
    assert code == 0, errtext
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(out)
    from trebuchet.spec.load import load_spec

    spec = load_spec(spec_path, environ={}).spec
    assert spec.ranks_per_node == 2 and spec.slurm.mpi == "pmix"  # options from $SRUN_ARGS
    env = {"PATH": os.environ["PATH"], "CKPT_DIR": "/ck pt", "UNSET_ONE": "u1 u2"}
    srun = 'srun() { while [[ $1 == -* ]]; do shift; done; "$@"; }\n'
    want = subprocess.run(
        ["bash", "-c", srun + SPLIT_SCRIPT], env=env, capture_output=True, text=True, check=True
    ).stdout
    got = subprocess.run(
        ["bash", "-c", spec.command], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert got == want
    assert "<--num-layers>\n<24>\n<--hidden-size>" in got and "<--data-path>\n</data/my>" in got
    # the references the script takes from the submitting shell are named in the report
    for name in ("CKPT_DIR", "UNSET_ONE"):
        assert any(
            f"${name}: the script read it from the environment" in e for e in errtext.splitlines()
        )


def test_usage_is_an_option_without_a_value() -> None:
    """`--usage` takes no value (sbatch's and srun's, as oracle.SRUN_FLAGS says): the
    option after it is read as its own, not as the value of --usage."""
    from trebuchet.importers import sbatch

    opts, rest = sbatch.parse_options(["--usage", "--nodes=2", "python", "x.py"], True)
    assert [(name, value) for name, value, _ in opts] == [("usage", None), ("nodes", "2")]
    assert rest == 2


@pytest.mark.parametrize("mine", ["/somewhere/of/mine", "."])
def test_a_variable_set_where_the_import_ran_stays_optional_as_in_bash(
    mine, capsys, tmp_path, monkeypatch
) -> None:
    """Megatron's `PYTHONPATH=...:${PYTHONPATH:-}`: bash gives "" where PYTHONPATH is unset.
    Imported where it was set, the spec read it back as a required `${PYTHONPATH}`, which
    then failed to load on a machine without it: the import depended on the importer's
    environment (a one-character value, `.`, was written into the spec as it was). It reads
    `${PYTHONPATH:-}` wherever the import ran."""
    monkeypatch.setenv("PYTHONPATH", mine)
    out, err, code = run_import(capsys, "sbatch", "megatron-mlm.sbatch")
    assert code == 0, err
    path = tmp_path / "job.yaml"
    path.write_text(out)
    spec = load_spec(path, environ={**ENVIRON}).spec  # PYTHONPATH not set here
    assert spec.env["PYTHONPATH"].endswith("/3rdparty/Megatron-LM:"), spec.env
    assert "/somewhere/of/mine" not in out
    spec = load_spec(path, environ={**ENVIRON, "PYTHONPATH": "/theirs"}).spec
    assert spec.env["PYTHONPATH"].endswith("/3rdparty/Megatron-LM:/theirs"), spec.env
