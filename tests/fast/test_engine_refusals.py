"""An engine's refusal of a spec field names the field's file:line (or the -o that set it),
as validation errors do: every engine refuses through LoadedSpec.refusal (issue 25: the
SkyPilot and Kubernetes refusals named only the file). The SkyPilot and Kubernetes cases
are in test_render_skypilot.py and test_render_kubernetes.py (test_refused_with_exit_2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TrebFn, write_spec
from trebuchet.errors import UserError
from trebuchet.spec.load import load_spec


def _refused(res, expected: str) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert expected in res.stderr, res.stderr


@pytest.fixture
def bare_path(tmp_path: Path) -> dict[str, str]:
    """A PATH without mpirun, horovodrun, torchrun or nsys."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty)}


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: r\ncommand: x\nlauncher: mpirun\n", "job.yaml:3: launcher: mpirun is not on PATH"),
        ("name: r\nlauncher: torchrun\ncommand: x\n",
         "job.yaml:2: launcher: torchrun is not on PATH"),
        ("name: r\ncommand: x\n\nprofile: nsys\n", "job.yaml:4: profile: nsys is not on PATH"),
    ],
)  # fmt: skip
def test_local_refusals_name_the_line(text: str, expected: str, treb: TrebFn, tmp_path: Path,
                                      bare_path: dict[str, str]) -> None:  # fmt: skip
    spec = write_spec(tmp_path, text)
    _refused(treb("run", "--no-check", str(spec), env=bare_path), expected)
    where, _, rest = expected.partition(": ")  # `treb check`: the same, as a finding
    res = treb("check", str(spec), env=bare_path)
    assert res.returncode == 1 and f"{where}: error: {rest}" in res.stdout, res.stdout
    assert not (tmp_path / "treb-home" / "runs").exists() or not os.listdir(
        tmp_path / "treb-home" / "runs")  # fmt: skip


def test_local_refusal_of_an_override_names_it(treb: TrebFn, tmp_path: Path,
                                               bare_path: dict[str, str]) -> None:  # fmt: skip
    spec = write_spec(tmp_path, "name: r\ncommand: x\n")
    res = treb("run", "--no-check", str(spec), "-o", "launcher=mpirun", env=bare_path)
    _refused(res, "treb: -o launcher=mpirun: launcher: mpirun is not on PATH")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: r\ncommand: x\nlauncher: horovod\nenv: {HOROVOD_CONTROLLER: gloo}\n",
         "job.yaml:4: env.HOROVOD_CONTROLLER: gloo is not available on the slurm backend"),
        ("name: r\nlauncher: mpirun\nenvironment: {image: img}\ncommand: x\n",
         "job.yaml:2: launcher: mpirun with a container image is not supported"),
        ("name: r\ncommand: x\nslurm:\n  mem: \"64G\\n\"\n", "job.yaml:4: slurm.mem: must be one line"),
        ("name: r\ncommand: x\ngpus_per_node: -1\n", "job.yaml:3: gpus_per_node: -1 (all visible)"),
        ("name: r\ncommand: x\nlauncher: mpirun\nspare_nodes: 1\n",
         "job.yaml:4: spare_nodes: spare nodes and a node range are not supported with mpirun"),
    ],
)  # fmt: skip
def test_slurm_render_refusals_name_the_line(text: str, expected: str, treb: TrebFn,
                                             tmp_path: Path) -> None:  # fmt: skip
    spec = write_spec(tmp_path, text)
    _refused(treb("render", str(spec), "--on", "slurm"), expected)


def test_refusal_helper(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: r\ncommand: x\nskypilot:\n  accelerators: A100\n")
    loaded = load_spec(spec, ["nodes=2"])
    err = loaded.refusal("skypilot.accelerators", "no")
    assert isinstance(err, UserError) and err.exit_code == 2
    assert str(err) == f"{spec}:4: skypilot.accelerators: no"
    assert str(loaded.refusal("nodes", "too many")) == "-o nodes=2: nodes: too many"


@pytest.mark.parametrize("engine", ["skypilot", "kubernetes"])
@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: r\ncommand: x\nspare_nodes: 1\n", "job.yaml:3: spare_nodes: not supported on"),
        ("name: r\ncommand: x\nnodes: '2:3'\n", "job.yaml:3: nodes: a node range MIN:MAX is not"),
    ],
)  # fmt: skip
def test_engines_that_place_nodes_refuse_spares(engine: str, text: str, expected: str,
                                                treb: TrebFn, tmp_path: Path) -> None:  # fmt: skip
    spec = write_spec(tmp_path, text + "environment: {image: img}\n")
    _refused(treb("render", str(spec), "--on", engine), expected)
