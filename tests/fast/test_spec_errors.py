"""A table of malformed specs: each exits 2 and names the file, line and field, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trebuchet.cli.main import main

GOOD = "command: python train.py\n"

# (case id, spec text, overrides, expected line, expected fragments of the message)
CASES = [
    (
        "nodes-word",
        "command: x\nnodes: two\n",
        [],
        2,
        ["nodes: must be an integer between 1 and 100000", "'two'"],
    ),
    (
        "nodes-zero",
        "command: x\nnodes: 0\n",
        [],
        2,
        ["nodes: must be an integer between 1 and 100000", "got 0"],
    ),
    ("nodes-negative", "command: x\nnodes: -3\n", [], 2, ["nodes:", "between 1 and"]),
    ("nodes-float", "command: x\nnodes: 1.5\n", [], 2, ["nodes: must be an integer"]),
    (
        "procs-zero",
        "command: x\n\nprocs_per_node: 0\n",
        [],
        3,
        ["procs_per_node: must be an integer between 1 and 1024"],
    ),
    ("gpus-bad", "command: x\ngpus_per_node: -2\n", [], 2, ["gpus_per_node:", "between -1 and 64"]),
    (
        "unknown-key",
        "command: x\nnodez: 2\n",
        [],
        2,
        ["nodez: unknown field", "did you mean 'nodes'"],
    ),
    (
        "unknown-nested",
        "command: x\nslurm:\n  acount: a\n",
        [],
        3,
        ["slurm.acount: unknown field", "'account'"],
    ),
    (
        "borrowed-gpus",
        "command: x\ngpus: 8\n",
        [],
        2,
        ["gpus: unknown field", "did you mean 'gpus_per_node'"],
    ),  # fmt: skip
    ("borrowed-num-nodes", "command: x\nnum_nodes: 2\n", [], 2, ["did you mean 'nodes'"]),
    (
        "borrowed-nproc",
        "command: x\nnproc_per_node: 2\n",
        [],
        2,
        ["did you mean 'procs_per_node'"],
    ),  # fmt: skip
    ("part-of-a-name", "command: x\nprocs: 2\n", [], 2, ["did you mean 'procs_per_node'"]),
    ("borrowed-time", "command: x\ntime: 1h\n", [], 2, ["did you mean 'timeout'"]),
    (
        "nested-alias",
        "command: x\nenvironment:\n  container: img\n",
        [],
        3,
        ["environment.container: unknown field", "did you mean 'image'"],
    ),  # fmt: skip
    (
        "slurm-time-limit",
        "command: x\nslurm: {time_limit: 1}\n",
        [],
        2,
        ["slurm.time_limit: unknown field", "did you mean 'time'"],
    ),  # fmt: skip
    (
        "misplaced-engine-key",
        "command: x\npartition: gpu\n",
        [],
        2,
        ["partition: unknown field", "slurm.partition"],
    ),
    (
        "launcher-typo",
        "command: x\nlauncher: torchrn\n",
        [],
        2,
        ["launcher: must be one of native, torchrun"],
    ),
    ("command-missing", "nodes: 1\n", [], 1, ["command: required field is missing"]),
    ("command-empty", "command: ''\n", [], 1, ["command: must be a non-empty string"]),
    ("command-blank", "command: '   '\n", [], 1, ["command: must be"]),
    ("command-empty-list", "command: []\n", [], 1, ["command: must be"]),
    ("command-mapping", "command: {a: 1}\n", [], 1, ["command: must be"]),
    ("command-list-of-ints", "command: [1, 2]\n", [], 1, ["command: must be"]),
    ("bad-yaml", "command: x\nnodes: [1\n", [], 3, ["invalid YAML"]),
    ("tab-indent", "command: x\nenv:\n\tA: 1\n", [], 3, ["invalid YAML"]),
    ("duplicate-key", "command: x\nnodes: 1\nnodes: 2\n", [], 3, ["nodes: duplicate key"]),
    ("not-a-mapping", "- a\n- b\n", [], 1, ["must be a mapping", "a list"]),
    ("scalar-doc", "hello\n", [], 1, ["must be a mapping"]),
    (
        "missing-var",
        "command: x\nenv:\n  DATA: ${TREB_TEST_NOPE}\n",
        [],
        3,
        ["env.DATA", "${TREB_TEST_NOPE} is not set", ":-"],
    ),
    ("bad-var-syntax", "command: x\nenv:\n  DATA: ${1BAD}\n", [], 3, ["env.DATA", "not a valid"]),
    (
        "env-list-value",
        "command: x\nenv:\n  A: [1, 2]\n",
        [],
        3,
        ["env.A: must be a string, number or boolean"],
    ),
    (
        "env-bad-name",
        "command: x\nenv:\n  9LIVES: 1\n",
        [],
        3,
        ["env.9LIVES", "not a valid variable name"],
    ),
    ("env-not-mapping", "command: x\nenv: [A]\n", [], 2, ["env: must be a mapping"]),
    (
        "secret-bad-name",
        "command: x\nsecrets: [HF-TOKEN]\n",
        [],
        2,
        ["secrets[0]: must be an environment variable"],
    ),
    (
        "secret-in-env",
        "command: x\nsecrets: [TOK]\nenv:\n  TOK: a\n",
        [],
        2,
        ["TOK is also set in env"],
    ),
    (
        "secret-outside-env",
        "command: x\nsecrets: [TOK]\nslurm:\n  account: ${TOK}\n",
        [],
        4,
        ["slurm.account", "secret"],
    ),
    ("name-invalid", "name: My Job\ncommand: x\n", [], 1, ["name: must be a name matching"]),
    (
        "retries-negative",
        "command: x\nretries: -1\n",
        [],
        2,
        ["retries: must be an integer between 0 and 1000"],
    ),
    ("timeout-garbage", "command: x\ntimeout: soon\n", [], 2, ["timeout: must be a duration"]),
    ("timeout-zero", "command: x\ntimeout: 0\n", [], 2, ["timeout: must be a duration"]),
    (
        "master-port-low",
        "command: x\nmaster_port: 80\n",
        [],
        2,
        ["master_port: must be an integer between"],
    ),
    (
        "profile-bad",
        "command: x\nprofile: perf\n",
        [],
        2,
        ["profile: must be one of none, nsys, torch"],
    ),
    (
        "bool-as-int",
        "command: x\nslurm:\n  exclusive: maybe\n",
        [],
        3,
        ["slurm.exclusive: must be true or false"],
    ),
    (
        "environment-bad",
        "command: x\nenvironment:\n  pyhton: '3.11'\n",
        [],
        3,
        ["environment.pyhton", "'python'"],
    ),
    (
        "sbatch-args-string",
        "command: x\nslurm:\n  sbatch_args: --foo\n",
        [],
        3,
        ["slurm.sbatch_args: must be a list"],
    ),
    (
        "workdir-missing",
        "command: x\nworkdir: does/not/exist\n",
        [],
        2,
        ["workdir:", "is not a directory"],
    ),
    (
        "image-with-conda",
        "command: x\nenvironment:\n  image: a\n  conda: {python: '3.11'}\n",
        [],
        3,
        ["environment.image: cannot be combined with environment.conda"],
    ),
    (
        "conda-no-way",
        "command: x\nenvironment:\n  conda: {conda_bin: micromamba}\n",
        [],
        3,
        ["environment.conda: needs environment_file or python"],
    ),
    (
        "mounts-no-image",
        "command: x\nenvironment:\n  mounts: ['/a:/a']\n",
        [],
        3,
        ["environment.mounts: mounts need environment.image"],
    ),
    (
        "requirements-missing",
        "command: x\nenvironment:\n  requirements: nope.txt\n",
        [],
        3,
        ["environment.requirements:", "nope.txt does not exist"],
    ),
    (
        "env-file-missing",
        "command: x\nenvironment:\n  conda:\n    environment_file: e.yml\n",
        [],
        4,
        ["environment.conda.environment_file:", "does not exist"],
    ),
    ("env-sets-rank", "command: x\nenv:\n  RANK: 3\n", [], 3, ["env.RANK: is set by the launcher"]),
    (
        "two-master-ports",
        "command: x\nmaster_port: 2000\nenv:\n  MASTER_PORT: 2001\n",
        [],
        4,
        ["set master_port or env.MASTER_PORT, not both"],
    ),
    (
        "log-policy-regex",
        "command: x\nlog_policies:\n  - {pattern: '(', action: retry}\n",
        [],
        3,
        ["log_policies[0].pattern: must be a regular expression"],
    ),
    (
        "override-bad-value",
        GOOD,
        ["nodes=two"],
        None,
        ["-o nodes=two: nodes: must be an integer between 1 and 100000"],
    ),
    (
        "override-unknown",
        GOOD,
        ["slurm.acount=x"],
        None,
        ["-o slurm.acount=x: slurm.acount: unknown field"],
    ),
    ("override-syntax", GOOD, ["nodes"], None, ["-o nodes: expected key.sub=value"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_spec_exit_2_with_location(case, tmp_path: Path, treb_home: Path, capsys) -> None:
    _, text, overrides, line, fragments = case
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    args = ["render", str(spec)]
    for o in overrides:
        args += ["-o", o]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if line is not None:
        assert f"{spec}:{line}:" in err, err
    for frag in fragments:
        assert frag in err, err


def test_every_problem_is_reported_at_once(tmp_path: Path, treb_home: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("command: x\nnodes: two\nlauncher: nope\nfoo: 1\n")
    assert main(["run", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:2: nodes" in err and f"{spec}:3: launcher" in err and f"{spec}:4: foo" in err


def test_missing_spec_file(tmp_path: Path, treb_home: Path, capsys) -> None:
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "no such spec file" in capsys.readouterr().err


def test_missing_secret_is_bad_input(tmp_path: Path, treb_home: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("TREB_TEST_SECRET", raising=False)
    spec = tmp_path / "job.yaml"
    spec.write_text("command: x\nsecrets: [TREB_TEST_SECRET]\n")
    assert main(["run", str(spec)]) == 2
    assert "TREB_TEST_SECRET not set" in capsys.readouterr().err
    assert not (treb_home / "runs").exists() or not any((treb_home / "runs").iterdir())


def test_real_cli_process_prints_no_traceback(tmp_path: Path, treb_home: Path) -> None:
    """The same through a real `treb` process, as a user sees it."""
    spec = tmp_path / "job.yaml"
    spec.write_text("command: python train.py\nnodes: two\n")
    res = subprocess.run(
        [sys.executable, "-m", "trebuchet", "run", str(spec)], capture_output=True, text=True
    )
    assert res.returncode == 2
    assert (
        res.stderr.strip()
        == f"treb: {spec}:2: nodes: must be an integer between 1 and 100000, or MIN:MAX "
        "(elastic: MAX, down to MIN after lost nodes), got 'two'"
    )


@pytest.mark.parametrize("verb", ["check", "render"])
def test_a_script_given_as_the_spec(verb: str, tmp_path: Path, treb_home: Path, capsys) -> None:
    """Issue 25: `treb check train.py` answered "invalid YAML"; it says what the file is and
    the smallest spec that runs it, and that spec is valid. (`treb run train.py` runs it
    without a spec, as torchrun would: issue 28, tests/integration/test_specless.py.)"""
    script = tmp_path / "train.py"
    script.write_text("import os\n\ndef main():\n    print(os.environ['RANK'])\n\nmain()\n")
    assert main([verb, str(script)]) == 2
    err = capsys.readouterr().err
    assert "YAML" not in err.splitlines()[0].replace("a YAML spec", "")
    assert f"treb: {script} is a Python script, not a spec" in err, err
    spec_text = "".join(ln[4:] + "\n" for ln in err.splitlines() if ln.startswith("    "))
    assert spec_text == "name: train\ncommand: python train.py\nnodes: 1\nprocs_per_node: 1\n"
    assert f"then: treb run {tmp_path / 'train.yaml'}" in err
    assert "or run it without a spec, from its folder: treb run -n 2 train.py" in err
    (tmp_path / "train.yaml").write_text(spec_text)
    assert main(["render", str(tmp_path / "train.yaml")]) == 0


def test_a_shell_script_given_as_the_spec(tmp_path: Path, treb_home: Path, capsys) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    assert main(["run", str(script)]) == 2
    err = capsys.readouterr().err
    assert "is a shell script, not a spec" in err and "treb run -n 2 -- bash run.sh" in err
    assert not (treb_home / "runs").exists() or not any((treb_home / "runs").iterdir())


@pytest.mark.parametrize(
    ("nodes", "error"),
    [
        ('"3:2"', "nodes: MIN:MAX needs 1 <= MIN <= MAX <= 100000, got 3:2"),
        ('"0:2"', "nodes: MIN:MAX needs 1 <= MIN <= MAX <= 100000, got 0:2"),
        ('"2:999999999"', "nodes: must be an integer between 1 and 100000, or MIN:MAX"),
        ('"2:3"\nmin_nodes: 2', "nodes: a range MIN:MAX, or min_nodes, not both"),
    ],
)
def test_a_node_range_is_checked_where_it_is_written(tmp_path: Path, nodes: str, error: str):
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: python train.py\nnodes: {nodes}\n")
    res = subprocess.run([sys.executable, "-m", "trebuchet", "render", str(spec)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"treb: {spec}:2: {error}"), res.stderr


def test_a_node_range_is_nodes_max_and_min_nodes(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text('command: python train.py\nnodes: "2:3"\nspare_nodes: 1\n')
    res = subprocess.run([sys.executable, "-m", "trebuchet", "render", "--on", "slurm", str(spec)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --nodes=4\n" in res.stdout and "#SBATCH --no-kill\n" in res.stdout
    assert '"min_nodes": 2' in res.stdout and '"spare_nodes": 1' in res.stdout
