"""`treb render --on kubernetes`: golden manifests, validated against the Kubernetes schemas
(kubernetes-validate ships them: no cluster, no network)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import needs
from trebuchet.cli.main import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
K8S_VERSION = "1.30"
SPEC = """\
name: k8s_job.v2
command: python train.py --msg "it's $(whoami) `id`"
nodes: 3
gpus_per_node: 4
master_port: 29511
retries: 1
timeout: 30m
secrets: [HF_TOKEN, WANDB_API_KEY]
env:
  A: "1"
  LITERAL: "$(not a reference)"
  FROM_SECRET: ${HF_TOKEN}
kubernetes: {namespace: ml-team, image: "nvcr.io/nvidia/pytorch:24.05-py3"}
"""


def render(tmp_path: Path, capsys, text: str, *over: str) -> tuple[int, str, str]:
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    code = main(["render", str(spec), "--on", "kubernetes", *over])
    out = capsys.readouterr()
    return code, out.out.replace(str(tmp_path), "$WORKDIR"), out.err


def validate(docs: list[dict]) -> None:
    kv = needs("kubernetes_validate")
    for doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("launcher", ["native", "torchrun", "none"])
def test_render_matches_golden_and_schema(launcher, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_super_secret_value")
    code, out, err = render(tmp_path, capsys, SPEC, "-o", f"launcher={launcher}")
    assert code == 0, err
    assert "hf_super_secret_value" not in out
    golden = GOLDEN / f"k8s-{launcher}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out)
    assert out == golden.read_text()
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    service, job = docs
    assert service["spec"]["clusterIP"] == "None" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "k8s-job-v2"
    (c,) = pod["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "k8s-job-v2", "key": "HF_TOKEN"}
    assert env["MASTER_ADDR"]["value"] == "k8s-job-v2-0.k8s-job-v2"
    assert env["LITERAL"]["value"] == "$$(not a reference)"  # $$ is Kubernetes' escape
    assert job["metadata"]["namespace"] == "ml-team"


def test_schema_validation_catches_a_broken_manifest(tmp_path, capsys) -> None:
    kv = needs("kubernetes_validate")
    code, out, _ = render(tmp_path, capsys, SPEC)
    job = [d for d in yaml.safe_load_all(out) if d][1]
    job["spec"]["completions"] = "three"
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)


def test_image_from_environment_and_no_gpus(tmp_path, capsys) -> None:
    code, out, err = render(tmp_path, capsys, "command: [python, t.py]\nenvironment: {image: i}\n")
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    c = docs[1]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "i" and "resources" not in c


@pytest.mark.parametrize(
    "spec,why",
    [
        ("command: x\n", "a pod needs an image"),
        (
            "command: x\nkubernetes: {image: i}\nenvironment: {requirements: [torch]}\n",
            "only image is used on Kubernetes",
        ),
        ("command: x\nkubernetes: {image: i}\ngpus_per_node: -1\n", "gpus_per_node: -1"),
    ],
)
def test_refused_with_exit_2(spec, why, tmp_path, capsys) -> None:
    code, out, err = render(tmp_path, capsys, spec)
    assert code == 2 and why in err and out == ""


def test_run_without_the_client_is_a_clear_exit_2(tmp_path, capsys, monkeypatch, treb_home) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    spec = tmp_path / "job.yaml"
    spec.write_text("command: echo hi\nkubernetes: {image: i}\n")
    assert main(["run", str(spec), "--on", "kubernetes"]) == 2
    assert "pip install 'trebuchet[kubernetes]'" in capsys.readouterr().err
