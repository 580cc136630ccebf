"""`treb import sbatch` and a value computed from a secret in a way that keeps none of its
stand-in (reversed, hex-encoded, cut to pieces, its length; issue 33): the import records
the script a second time with other stand-ins, and what changes with them is named (in the
srun command: exit 2) or withheld (in the environment: a secret), never written as a
literal. Randomness ($RANDOM, mktemp, date) is not blamed on the secret."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.fast.test_import_hostile import run
from trebuchet.importers import oracle

NAMED = {
    "rev": 'T=$(rev <<<"$API_TOKEN")\nsrun python train.py --t "$T"\n',
    "xxd": 'srun python train.py --t "$(printf %s "$API_TOKEN" | xxd -p -c 4 | paste -sd.)"\n',
    "base64": 'T=$(printf %s "$API_TOKEN" | base64)\nsrun python train.py --t "$T"\n',
    "char-loop": (
        "for ((i=0;i<${#API_TOKEN};i++)); do X+=${API_TOKEN:i:1}-; done\n"
        'srun python train.py --t "$X"\n'
    ),
    "slice": 'srun python train.py --p "${API_TOKEN:0:3}"\n',
    "length": "srun python train.py --n ${#API_TOKEN}\n",
}


@pytest.mark.parametrize("body", NAMED.values(), ids=NAMED.keys())
def test_an_argument_computed_from_a_secret_is_named(capsys, tmp_path, body) -> None:
    code, out, err = run(capsys, tmp_path, body)
    assert code == 2, (out, err)
    line = body.count("\n") + 2
    assert re.search(
        rf"job\.sh:{line}: argument \d+ of the srun command is computed from \$API_TOKEN in "
        r"the script \(.*\): treb cannot carry it; pass the secret itself \(\"\$API_TOKEN\"\) "
        "or compute it in the program",
        err,
    ), err
    assert "Traceback" not in err


ENV = {
    "rev": 'export T=$(rev <<<"$API_TOKEN")\nsrun python train.py\n',
    "xxd": 'export T=$(printf %s "$API_TOKEN" | xxd -p -c 4 | paste -sd.)\nsrun python train.py\n',
    "char-loop": (
        "for ((i=0;i<${#API_TOKEN};i++)); do T+=${API_TOKEN:i:1}-; done\nexport T\n"
        "srun python train.py\n"
    ),
    "slice": 'export T="${API_TOKEN:0:3}"\nsrun python train.py\n',
}


@pytest.mark.parametrize("body", ENV.values(), ids=ENV.keys())
def test_an_environment_value_computed_from_a_secret_is_withheld(capsys, tmp_path, body) -> None:
    code, out, err = run(capsys, tmp_path, body)
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert "T" not in spec.get("env", {}), out
    assert "T" in spec["secrets"], out
    assert "T: withheld: its value is made from a secret ($API_TOKEN)" in err, err


def test_the_secret_that_changes_a_value_is_the_one_named(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        'export A="$API_TOKEN"\nT=$(rev <<<"$HF_TOKEN")\nsrun python train.py --t "$T"\n',
    )
    assert code == 2, (out, err)
    assert "computed from $HF_TOKEN in the script" in err, err
    assert "computed from $API_TOKEN" not in err, err


@pytest.fixture
def recordings(monkeypatch) -> list[int]:
    """How many times the import ran the script in its sandbox (each run is real)."""
    seen: list[int] = []
    real = oracle.record

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(oracle, "record", counted)
    return seen


def test_randomness_without_a_secret_imports_as_before_with_one_recording(
    capsys, tmp_path, recordings
) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        'D=$(mktemp -d)\nexport RUN_ID=$RANDOM\nsrun python train.py --seed $RANDOM --dir "$D"\n',
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert re.fullmatch(r"python train\.py --seed \d+ --dir /tmp/\S+", spec["command"]), out
    assert re.fullmatch(r"\d+", spec["env"]["RUN_ID"]), out
    assert "secrets" not in spec
    assert len(recordings) == 1


def test_randomness_beside_a_secret_is_not_blamed_on_it(capsys, tmp_path, recordings) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        "export RUN_ID=$RANDOM-$(date +%N)-$$\n"
        'srun python train.py --seed $RANDOM --dir "$(mktemp -d)" --at $(date +%N) '
        '--t "$API_TOKEN"\n',
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["secrets"] == ["API_TOKEN"], out
    assert re.fullmatch(
        r'python train\.py --seed \d+ --dir /tmp/\S+ --at \d+ --t "\$\{API_TOKEN\}"',
        spec["command"],
    ), out
    assert re.fullmatch(r"\d+-\d+-\d+", spec["env"]["RUN_ID"]), out
    assert "computed from" not in err
    assert len(recordings) >= 2


def test_an_argument_that_reads_a_withheld_variable_reads_it_at_run_time(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys, tmp_path, 'export T=$(rev <<<"$API_TOKEN")\nsrun python train.py --t "$T"\n'
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert spec["command"] == 'python train.py --t "${T}"', out
    assert spec["secrets"] == ["T"], out
    assert "T: withheld: its value is made from a secret ($API_TOKEN)" in err, err


def test_a_torchrun_argument_computed_from_a_secret_is_named(capsys, tmp_path) -> None:
    code, out, err = run(
        capsys,
        tmp_path,
        "srun bash -c 'torchrun --nproc_per_node=2 train.py --t $(rev <<<\"$API_TOKEN\")'\n",
    )
    assert code == 2, (out, err)
    assert "job.sh:3: argument 4 of torchrun is computed from $API_TOKEN in the script" in err
