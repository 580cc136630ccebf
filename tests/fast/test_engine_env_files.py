"""The environment's files on SkyPilot and Kubernetes once `treb run` took the code
snapshot: the spec names them in its workdir, the nodes get them in the copy (the
engines' render of a submitted run, backends/node_setup.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trebuchet.backends.kubernetes.engine import KubernetesBackend
from trebuchet.backends.skypilot.engine import SkyPilotBackend
from trebuchet.spec.load import load_spec

SPEC = """\
name: env-files
command: python train.py
environment: {setup: tools/setup.sh, requirements: reqs.txt, bare_nodes_only: true}
kubernetes: {image: python:3.12-slim}
"""


def submitted(tmp_path: Path):
    """The spec loaded, then its workdir swapped for a copy as launcher/submit.py does."""
    work = tmp_path / "work"
    (work / "tools").mkdir(parents=True)
    (work / "job.yaml").write_text(SPEC)
    (work / "tools" / "setup.sh").write_text("echo set up\n")
    (work / "reqs.txt").write_text("")
    (work / "train.py").write_text("")
    loaded = load_spec(work / "job.yaml", [])
    code = tmp_path / "runs" / "r1" / "code"
    shutil.copytree(work, code)
    loaded.origin, loaded.workdir = loaded.workdir, code
    return loaded


def test_skypilot_task_of_a_submitted_run_builds_from_the_copy(tmp_path: Path) -> None:
    task = SkyPilotBackend().task(submitted(tmp_path), "r1", tmp_path / "runs" / "r1")
    assert task["workdir"] == str(tmp_path / "runs" / "r1" / "code")
    assert "python -m pip install -r reqs.txt\n" in task["setup"]
    assert "bash tools/setup.sh\n" in task["setup"]


def test_kubernetes_pod_of_a_submitted_run_builds_from_the_copy(tmp_path: Path) -> None:
    (job,) = KubernetesBackend().manifests(submitted(tmp_path), "r1", whole=False)[2:]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "python -m pip install -r reqs.txt\n" in script
    assert "bash tools/setup.sh\n" in script


def test_a_file_outside_the_workdir_is_still_refused(tmp_path: Path) -> None:
    loaded = submitted(tmp_path)
    loaded.spec.environment.setup = "../elsewhere.sh"  # type: ignore[union-attr]
    with pytest.raises(Exception, match="outside workdir .*work: SkyPilot only ships"):
        SkyPilotBackend().task(loaded, "r1", tmp_path / "runs" / "r1")
