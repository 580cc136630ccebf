"""`treb render --on kubernetes`: golden manifests, validated against the Kubernetes schemas
(kubernetes-validate ships them: no cluster, no network)."""

from __future__ import annotations

import os
import sys
import time
import types
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


class _Obj(types.SimpleNamespace):
    """The attribute shape of the kubernetes client's V1Job objects."""


def _job(name: str, active: int = 0, conditions: list | None = None) -> _Obj:
    conds = [_Obj(type=t, status="True", reason=r, message=m) for t, r, m in conditions or []]
    return _Obj(metadata=_Obj(name=name), status=_Obj(active=active, conditions=conds))


def _stand_in_client(monkeypatch, jobs: dict[str, list], calls: list) -> None:
    """A stand-in for the official client (no Kubernetes cluster can run here): the real
    client's names and shapes, jobs per namespace from the test."""

    class BatchV1Api:
        def list_namespaced_job(self, ns: str, label_selector: str = "") -> _Obj:
            calls.append((ns, label_selector))
            return _Obj(items=jobs.get(ns, []))

    client = types.ModuleType("kubernetes.client")
    client.BatchV1Api = BatchV1Api
    config = types.ModuleType("kubernetes.config")
    config.load_kube_config = lambda: None
    pkg = types.ModuleType("kubernetes")
    pkg.client, pkg.config = client, config
    for name, mod in [("kubernetes", pkg), ("kubernetes.client", client),
                      ("kubernetes.config", config)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)


def test_refresh_follows_jobs_with_one_list_call_per_namespace(treb_home, monkeypatch) -> None:
    from trebuchet.backends.kubernetes import KubernetesBackend
    from trebuchet.store.db import RunRecord, Store

    store = Store()
    wanted = {"a": "default/a", "b": "default/b", "c": "default/c", "d": "ml/d", "e": "ml/e"}
    for rid, job in wanted.items():
        store.insert_run(RunRecord(
            id=rid, name=rid, backend="kubernetes", launcher="native", state="RUNNING", nodes=2,
            procs_per_node=1, run_dir=str(treb_home / rid), created_at=time.time(),
            backend_id=job,
        ))  # fmt: skip
    calls: list = []
    _stand_in_client(monkeypatch, {
        "default": [
            _job("a", active=2),
            _job("b", conditions=[("Complete", None, None)]),
            _job("c", conditions=[("Failed", "BackoffLimitExceeded", "Job has reached the "
                                   "specified backoff limit")]),
        ],
        "ml": [_job("d", conditions=[("Failed", "DeadlineExceeded", "past its deadline")])],
    }, calls)  # fmt: skip
    KubernetesBackend().refresh(store, store.list(active_only=True))
    assert sorted(calls) == [
        ("default", "trebuchet.dev/workload"),
        ("ml", "trebuchet.dev/workload"),
    ]
    states = {r.id: r.state for r in store.list()}
    assert states == {"a": "RUNNING", "b": "SUCCEEDED", "c": "FAILED", "d": "TIMEOUT", "e": "LOST"}
    assert store.attempts("c")[0]["reason"].startswith("BackoffLimitExceeded: Job has reached")
    assert "deleted outside trebuchet" in store.attempts("e")[0]["reason"]


def test_refresh_without_the_client_concludes_nothing(treb_home, monkeypatch) -> None:
    from trebuchet.backends.kubernetes import KubernetesBackend
    from trebuchet.store.db import RunRecord, Store

    monkeypatch.setitem(sys.modules, "kubernetes", None)
    store = Store()
    store.insert_run(RunRecord(
        id="k", name="k", backend="kubernetes", launcher="native", state="RUNNING", nodes=1,
        procs_per_node=1, run_dir=str(treb_home / "k"), created_at=time.time(),
        backend_id="default/k",
    ))  # fmt: skip
    KubernetesBackend().refresh(store, store.list(active_only=True))
    assert store.get("k").state == "RUNNING"
