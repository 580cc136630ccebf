"""Imported batch scripts run for real (issue 24): the spec `treb import sbatch` wrote from a
fixture runs locally and on the Slurm test cluster, and every rank's probe (the fixtures'
probe.py in place of the training program) received the argv and environment the original
script gives its ranks under bash."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.slurm_support import slurm_conf, streb  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration
CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "sbatch"

# fixture -> (ranks, argv every rank receives, IMP_* environment every rank sees)
RUNS = {
    "array-oneline": (2, ["--total_epochs", "500", "--save_every", "50", "--name", "two words"], {}),
    "array-multiline-torchrun": (4, ["--total_epochs", "500", "--save_every", "50",
                                 "--batch_size", "32", "--checkpoint_path", "./snapshot.pt"],
                                 {"IMP_LOGLEVEL": "INFO"}),
    "conditional-export": (2, ["--mode", "multi"], {"IMP_MODE": "multi", "IMP_NCCL_IB_DISABLE": "1"}),
    "heredoc-read": (2, ["--epochs", "3", "--tag", "a b"], {}),
    "heredoc-cat": (2, ["--prompt", "hello world", "--n", "2"], {}),
    "quoted-args": (2, ["--data", "/data/my set", "--json", '{"a": [1, 2]}', "--empty", "",
                    "--price", "$5", "--name", "run one", "plain"], {}),
}  # fmt: skip
ON_SLURM = ("array-multiline-torchrun", "quoted-args", "heredoc-read", "conditional-export")


def import_and_run(treb, tmp_path: Path, name: str, *on: str) -> dict[str, dict]:
    imported = treb("import", "sbatch", str(CORPUS / f"{name}.sbatch"))
    assert imported.returncode == 0, imported.stderr
    spec = tmp_path / "job.yaml"
    spec.write_text(imported.stdout)
    out = tmp_path / "probe"
    out.mkdir()
    res = treb("run", str(spec), *on, env={"PROBE_OUT": str(out)}, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_imported_spec_runs_locally_with_the_scripts_arguments(name, treb, tmp_path) -> None:
    ranks, argv, env = RUNS[name]
    seen = import_and_run(treb, tmp_path, name)
    assert sorted(seen) == [str(r) for r in range(ranks)]
    for rank in seen.values():
        assert rank["argv"] == argv and rank["env"] == env


@pytest.mark.slurm
@pytest.mark.parametrize("name", ON_SLURM)
def test_imported_spec_runs_on_slurm_with_the_scripts_arguments(name, streb, tmp_path) -> None:
    ranks, argv, env = RUNS[name]
    seen = import_and_run(streb, tmp_path, name, "--on", "slurm")
    assert sorted(seen) == [str(r) for r in range(ranks)]
    for rank in seen.values():
        assert rank["argv"] == argv and rank["env"] == env
