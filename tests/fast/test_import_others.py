"""`treb import air | madengine | nemo`: seeds 003, 000 and 001; specs load, drops reported."""

from __future__ import annotations

import pytest

from tests.fast.import_helpers import FIXTURES, imported, notes_at, run_import
from trebuchet.cli.main import main


def test_air_seed_003_workload(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "air", "databricks-train.yaml")
    spec = loaded.spec
    assert (spec.name, spec.nodes, spec.gpus_per_node) == ("llama-sft", 2, 8)
    assert spec.launcher == "none"  # the command runs torchrun itself, once per node
    assert spec.ranks_per_node == 8  # LOCAL_WORLD_SIZE as ${LOCAL_WORLD_SIZE:-8} expects
    assert 'torchrun \\\n  --nnodes="$NUM_NODES"' in spec.command
    assert spec.environment.requirements == ["transformers>=4.45", "datasets>=3.0"]
    assert spec.timeout == 7200 and spec.retries == 1
    assert spec.skypilot.accelerators == "H100:8"
    assert loaded.workdir == FIXTURES
    assert any("environment.version" in e and "not carried over" in e for e in notes_at(err, 6))


def test_air_accelerators_must_be_a_multiple(capsys, tmp_path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text(
        "command: python t.py\ncompute:\n  num_accelerators: 12\n"
        "  accelerator_type: GPU_8xH100\nenv_variables:\n  A: 1\n"
    )
    from trebuchet.cli.main import main

    assert main(["import", "air", str(bad)]) == 2
    assert "w.yaml:3: num_accelerators 12 is not a multiple of 8" in capsys.readouterr().err


def test_air_env_variables_and_unknown_keys(capsys, tmp_path) -> None:
    src = tmp_path / "w.yaml"
    src.write_text(
        "command: python t.py\nenv_variables:\n  LR: 0.1\n  HF_TOKEN: hf_"
        "abcdefghijklmnopqrstuvwx\nfancy: 1\n"
    )
    from trebuchet.cli.main import main

    assert main(["import", "air", str(src)]) == 0
    out = capsys.readouterr()
    assert "abcdefghijklmnop" not in out.out + out.err
    assert "w.yaml:5: not carried over: fancy" in out.err
    import yaml

    data = yaml.safe_load(out.out)
    assert data["env"] == {"LR": "0.1"} and data["secrets"] == ["HF_TOKEN"]


def test_madengine_single_card_seed_000(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "madengine", "madengine-card.json")
    spec = loaded.spec
    assert spec.name == "pyt_train_example_bare_metal" and spec.launcher == "none"
    assert spec.command == (  # the resolved count: TREB_NGPUS (every visible GPU with -1)
        'MAD_RUNTIME_NGPUS="${MAD_RUNTIME_NGPUS:-${TREB_NGPUS:-0}}" '
        "bash scripts/example/train_bare_metal.sh"
    )
    assert any("MAD_RUNTIME_NGPUS to the resolved count" in e for e in notes_at(err, 4))
    assert spec.gpus_per_node == -1 and spec.nodes == 1
    env = spec.environment
    assert env.name == "mad_pyt_train_example_bare_metal" and env.conda.python == "3.12"
    assert env.requirements == str(FIXTURES / "scripts/example/requirements.txt")
    assert env.setup == str(FIXTURES / "scripts/example/setup.sh")
    assert loaded.workdir == FIXTURES


def test_madengine_models_json_with_tags(capsys, tmp_path) -> None:
    data, err, loaded = imported(
        capsys, tmp_path, "madengine", "madengine-models.json", "--tags", "bert"
    )
    spec = loaded.spec
    assert spec.name == "pyt_bert_train" and spec.command == (
        'MAD_RUNTIME_NGPUS="${MAD_RUNTIME_NGPUS:-${TREB_NGPUS:-8}}" '
        "python scripts/bert/run.py --batch-size 32 --epochs 1"
    )
    assert (spec.gpus_per_node, spec.nodes, spec.timeout) == (8, 2, 7200)
    # madengine's multiple_results CSV is what trebuchet's results.file reads
    assert spec.results.file == "perf_bert.csv" and data["results"] == {"file": "perf_bert.csv"}
    assert any("multiple_results perf_bert.csv: results.file" in e for e in notes_at(err, 25))
    joined = "\n".join(err)
    assert "not carried over: multiple_results" not in joined
    for dropped in (
        "dockerfile",
        "owner",
        "training_precision",
        "distributed.master_port",
        "environment_file",
    ):
        assert f"not carried over: {dropped}" in joined, dropped
    assert notes_at(err, 18) and notes_at(err, 27)  # dockerfile, environment_file (missing)


def test_imported_model_sees_mad_runtime_ngpus_and_its_results_csv(
    capsys, tmp_path, treb, monkeypatch
) -> None:
    """A real local run of an imported card (n_gpus -1, 4 GPUs detected: the tests' stand-in
    for detection): the script reads MAD_RUNTIME_NGPUS = 4, writes its multiple_results
    CSV, and `treb results` turns its rows into results as madengine does."""
    import json

    from trebuchet.cli.main import main

    mad = tmp_path / "mad"
    (mad / "scripts").mkdir(parents=True)
    (mad / "scripts" / "run.sh").write_text(
        'echo "ngpus=$MAD_RUNTIME_NGPUS"\n'
        'printf "model,performance,metric\\nfwd,%s,samples_per_second\\n" '
        '"$((MAD_RUNTIME_NGPUS * 10))" > perf_m.csv\n'
    )
    card = {"name": "m", "scripts": "scripts/run.sh", "n_gpus": "-1",
            "multiple_results": "perf_m.csv"}  # fmt: skip
    (mad / "models.json").write_text(json.dumps([card]))
    assert main(["import", "madengine", str(mad / "models.json")]) == 0
    spec = mad / "job.yaml"
    spec.write_text(capsys.readouterr().out)
    res = treb("run", str(spec), env={"TREB_FAKE_GPUS": "nvidia:4"})
    assert res.returncode == 0 and "ngpus=4" in res.stdout, res.stdout + res.stderr
    res = treb("results", "--json")
    (row,) = json.loads(res.stdout)
    assert (row["model"], row["performance"], row["metric"]) == (
        "m_fwd",
        40.0,
        "samples_per_second",
    ), row


def test_render_of_an_imported_conda_model_without_conda(
    capsys, tmp_path, treb_home, monkeypatch
) -> None:
    """Seed 000's card builds a conda prefix; on a host without conda `treb render --on
    slurm` is a dry run: it renders (the prefix's `conda run`) and warns; `treb run`
    still refuses, with the field's line."""
    from trebuchet.cli.main import main

    empty = tmp_path / "bin"
    empty.mkdir()
    data, err, loaded = imported(capsys, tmp_path, "madengine", "madengine-card.json")
    monkeypatch.setenv("PATH", str(empty))  # no micromamba, mamba or conda
    spec = str(tmp_path / "job.yaml")
    assert main(["render", spec, "--on", "slurm", "-o", "gpus_per_node=8"]) == 0
    out = capsys.readouterr()
    assert '"command": ["conda", "run", "-p", ' in out.out
    assert "MAD_RUNTIME_NGPUS" in out.out
    assert "job.yaml:12: environment.conda: no micromamba, mamba or conda" in out.err
    assert "treb render: warning:" in out.err
    assert main(["run", spec, "--on", "slurm", "-o", "gpus_per_node=8"]) == 2
    assert "job.yaml:12: environment.conda: no micromamba" in capsys.readouterr().err


def test_madengine_tags_must_pick_one(capsys) -> None:
    out, err, code = run_import(capsys, "madengine", "madengine-models.json", "--tags", "pyt")
    assert code == 2 and "2 cards match" in err
    out, err, code = run_import(capsys, "madengine", "madengine-models.json", "--tags", "nope")
    assert code == 2 and "no card matches" in err


def test_madengine_tags_that_are_not_a_list_are_matched_as_text(capsys, tmp_path) -> None:
    """`tags: 1` (found by hypothesis: 'int' object is not iterable, a traceback)."""
    cards = tmp_path / "models.json"
    cards.write_text(
        '[{"name": "a", "tags": 1, "scripts": "run.sh"}, {"name": "b", "tags": ["x"]}]'
    )
    code = main(["import", "madengine", str(cards), "--tags", "1"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "run.sh" in out.out


@pytest.mark.parametrize("name", ["nemo-slurm.yaml", "nemo-slurm-minimal.yaml"])
def test_nemo_slurm_block_seed_001(name, capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "nemo", name)
    spec = loaded.spec
    assert (spec.name, spec.nodes, spec.ranks_per_node, spec.gpus_per_node) == (
        "llm_finetune",
        2,
        8,
        8,
    )
    assert spec.launcher == "torchrun"
    assert (spec.slurm.time, spec.slurm.account, spec.slurm.partition) == (
        "04:00:00",
        "my_account",
        "batch",
    )
    assert spec.environment.image == "nvcr.io/nvidia/nemo:dev"
    assert spec.env["HF_HOME"] == "/home/user/.cache/huggingface"  # ${HOME} at submission
    assert data["env"]["HF_HOME"] == "${HOME}/.cache/huggingface"
    assert "HF_TOKEN" in spec.secrets and "HF_TOKEN" not in spec.env
    assert "nemo_automodel/recipes/llm/train_ft.py -c " in spec.command
    if name == "nemo-slurm.yaml":
        assert spec.environment.mounts == ["/data:/data"]
        assert spec.secrets == ["WANDB_API_KEY", "HF_TOKEN"]
    else:
        assert spec.master_port == 13742


def test_nemo_nsys_and_skypilot(capsys, tmp_path) -> None:
    data, err, loaded = imported(capsys, tmp_path, "nemo", "nemo-nsys.yaml")
    assert loaded.spec.profile == "nsys" and loaded.spec.name == "llm_profile"
    data, err, loaded = imported(capsys, tmp_path, "nemo", "nemo-skypilot.yaml")
    spec = loaded.spec
    assert (spec.nodes, spec.gpus_per_node) == (2, 8)
    sky = spec.skypilot
    assert (sky.cloud, sky.accelerators, sky.use_spot, sky.disk_size, sky.region) == (
        "aws",
        "H100:8",
        True,
        200,
        "us-east-1",
    )
    assert spec.environment.requirements == ["nemo-automodel"]
    assert spec.secrets == ["HF_TOKEN"]


def test_nemo_references_kept_and_defaults_translated(capsys, tmp_path) -> None:
    src = tmp_path / "c.yaml"
    src.write_text(
        "recipe:\n  _target_: pkg.mod.Recipe\nslurm:\n  nodes: 1\n"
        "  ntasks_per_node: 2\n  env_vars:\n    DATA: ${DATA_DIR,/data}\n"
        "    PLAIN: ${PLAIN_VAR}\n  weird_key: 1\n"
    )
    from trebuchet.cli.main import main

    assert main(["import", "nemo", str(src)]) == 0
    out = capsys.readouterr()
    import yaml

    data = yaml.safe_load(out.out)
    assert data["env"] == {"DATA": "${DATA_DIR:-/data}", "PLAIN": "${PLAIN_VAR}"}
    assert "pkg/mod.py" in data["command"]
    assert "c.yaml:9: not carried over: slurm.weird_key" in out.err


def test_unknown_kind_is_a_usage_error() -> None:
    from trebuchet.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["import", "docker", "x"])
    assert exc.value.code == 2


@pytest.mark.parametrize(
    ("kind", "name", "text", "said"),
    [
        ("nemo", "n.yaml", "slurm:\n  ntasks_per_node: ''\n", "n.yaml:2: slurm.ntasks_per_node"),
        ("nemo", "n.yaml", "slurm:\n  master_port: 1e999\n", "n.yaml:2: slurm.master_port"),
        ("madengine", "m.json", '[{"name": "a", "scripts": "r.sh", "distributed": {"nnodes": ""}}]',
         "distributed.nnodes"),
        ("determined", "d.yaml", "entrypoint: python t.py\noptimizations:\n"
         "  tensor_fusion_threshold: .inf\n", "d.yaml:3"),
    ],
)  # fmt: skip
def test_numbers_that_are_not_numbers_are_named(kind, name, text, said, capsys, tmp_path) -> None:
    """Found by hypothesis: int('') and int(inf) were tracebacks."""
    path = tmp_path / name
    path.write_text(text)
    code = main(["import", kind, str(path)])
    err = capsys.readouterr().err
    assert code in (0, 2) and said in err, err
