"""`treb render --on kubernetes`: golden manifests, validated against the Kubernetes schemas
(kubernetes-validate ships them: no cluster, no network); `treb run` and `treb cancel`
through a stand-in of the official client. The pod command itself runs in
tests/integration/test_engine_nodes.py."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest
import yaml

from tests.conftest import needs, needs_program
from trebuchet.cli.main import main
from trebuchet.launcher.runtime_file import archive

RUNTIME = re.compile(r"treb-runtime-\d+-[0-9a-f]{12}\.pyz")
FAILURE_COUNT = "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"

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
    normal = RUNTIME.sub("treb-runtime-VERSION-HASH.pyz", out)
    golden = GOLDEN / f"k8s-{launcher}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    configmap, service, job = docs
    assert service["spec"]["clusterIP"] == "None" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    # retries per index, so that each pod knows its attempt; the first spent index fails all
    assert job["spec"]["backoffLimitPerIndex"] == 1 and job["spec"]["maxFailedIndexes"] == 0
    assert "backoffLimit" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    # the objects of one run: the workload's name and the run id (RUN_ID in a render)
    assert pod["subdomain"] == service["metadata"]["name"] == "k8s-job-v2-run-id"
    assert job["metadata"]["name"] == configmap["metadata"]["name"] == "k8s-job-v2-run-id"
    assert pod["volumes"][0] == {"name": "treb", "configMap": {"name": "k8s-job-v2-run-id"}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    (c,) = pod["containers"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "4"}, "requests": {"cpu": "4"}}
    env = {e["name"]: e for e in c["env"]}
    # the Secret is the workload's, one for all its runs
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "k8s-job-v2", "key": "HF_TOKEN"}
    assert env["MASTER_ADDR"]["value"] == "k8s-job-v2-run-id-0.k8s-job-v2-run-id"
    assert "kubectl create secret generic k8s-job-v2 --from-literal=HF_TOKEN" in out
    assert env["LITERAL"]["value"] == "$$(not a reference)"  # $$ is Kubernetes' escape
    assert env["TREB_ATTEMPT"]["valueFrom"] == {"fieldRef": {"fieldPath": FAILURE_COUNT}}
    assert "FROM_SECRET" not in env  # expanded by the node agent (job.json's secret_env)
    assert job["metadata"]["namespace"] == configmap["metadata"]["namespace"] == "ml-team"
    # the spec's values are in the job file, not in the pod command (where Kubernetes
    # would expand $(...)): the command only places the node and starts the agent
    name = archive()[0]
    assert c["command"][:2] == ["sh", "-c"] and "whoami" not in c["command"][2]
    check = subprocess.run([needs_program("shellcheck"), "-s", "sh", "-S", "warning", "-"],
                           input=c["command"][2], capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout
    assert c["command"][2].endswith(f"exec python3 -S /treb/{name} node /treb/job.json\n")
    job_file = json.loads(configmap["data"]["job.json"])
    assert job_file["command"] == ["bash", "-c", 'python train.py --msg "it\'s $(whoami) `id`"']
    assert job_file["secret_env"] == {"FROM_SECRET": "${HF_TOKEN}"}
    assert list(configmap["binaryData"]) == [name, "code.tar.gz"]  # both elided in a render
    assert configmap["binaryData"]["code.tar.gz"].startswith("<code.tar.gz: the 1 file(s)")
    assert c["command"][2].index("tar -xzf /treb/code.tar.gz") < c["command"][2].index("exec")


def test_schema_validation_catches_a_broken_manifest(tmp_path, capsys) -> None:
    kv = needs("kubernetes_validate")
    code, out, _ = render(tmp_path, capsys, SPEC)
    job = [d for d in yaml.safe_load_all(out) if d][2]
    job["spec"]["completions"] = "three"
    with pytest.raises(kv.ValidationError):
        kv.validate(job, K8S_VERSION, strict=True)


def test_image_from_environment_and_no_gpus(tmp_path, capsys) -> None:
    code, out, err = render(tmp_path, capsys, "command: [python, t.py]\nenvironment: {image: i}\n")
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    c = docs[2]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "i" and c["resources"] == {"requests": {"cpu": "1"}}  # one rank


@pytest.mark.parametrize(
    "spec,why",
    [
        (
            "command: x\nkubernetes: {namespace: ns}\n",
            "job.yaml:2: kubernetes.image: a pod needs an image",
        ),
        (
            "command: x\nkubernetes: {image: i}\nlauncher: horovod\n",
            "job.yaml:3: launcher: horovod is not rendered for Kubernetes",
        ),
        (
            "command: x\nkubernetes: {image: i}\nenvironment: {image: i, mounts: ['/a:/a']}\n",
            "job.yaml:3: environment.mounts: a pod cannot bind-mount host paths",
        ),
        (
            "command: x\nkubernetes: {image: i}\nenvironment: {requirements: ../r.txt}\n",
            "job.yaml:3: environment.requirements: ",
        ),
        (
            "command: x\nkubernetes: {image: i, checkpoint_volume: Bad_Name}\n",
            "job.yaml:2: kubernetes.checkpoint_volume",
        ),
        ("command: x\nkubernetes: {image: i, code_dir: app}\n", "job.yaml:2: kubernetes.code_dir"),
        (
            "command: x\nkubernetes: {image: i}\ngpus_per_node: -1\n",
            "job.yaml:3: gpus_per_node: -1",
        ),
    ],
)
def test_refused_with_exit_2(spec, why, tmp_path, capsys) -> None:
    (tmp_path / "r.txt").write_text("torch\n")  # outside the workdir (the spec's folder)
    code, out, err = render(tmp_path, capsys, spec)
    assert code == 2 and why in err and out == "", err


def _pod(docs: list[dict]) -> dict:
    return docs[2]["spec"]["template"]["spec"]


def test_code_archive_environment_and_checkpoint_volume(tmp_path, capsys) -> None:
    """The code travels in the ConfigMap (unpacked into /treb-code), the environment is
    built in the pod before the agent, the PVC is mounted where TREB_CHECKPOINT_DIR points;
    without secrets the header says nothing of a Secret (no sentence cut off)."""
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    (tmp_path / "train.py").write_text("import torch\n")
    code, out, err = render(tmp_path, capsys, "command: python train.py\nnodes: 2\nretries: 1\n"
                            "environment: {requirements: requirements.txt}\n"
                            "kubernetes: {image: 'python:3.12', checkpoint_volume: ckpt}\n")  # fmt: skip
    assert code == 0, err
    head = [line for line in out.splitlines() if line.startswith("#")][:4]
    assert head[1].startswith("# The Job, Service and ConfigMap are named after the run")
    assert head[2].endswith("the code snapshot the pod unpacks into /treb-code "
                            "(archives elided here).")  # fmt: skip
    assert head[3] == "# GPUs as nvidia.com/gpu." and "Secret" not in out
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    configmap, pod = docs[0], _pod(docs)
    assert configmap["binaryData"]["code.tar.gz"].startswith("<code.tar.gz: the 3 file(s)")
    assert json.loads(configmap["data"]["job.json"])["checkpoint_dir"] == "/treb-checkpoints/RUN_ID"
    assert {"name": "treb-checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod[
        "volumes"
    ]
    (c,) = pod["containers"]
    assert {"name": "treb-code", "mountPath": "/treb-code"} in c["volumeMounts"]
    assert "workingDir" not in c
    script = c["command"][2]
    order = ["cd /treb-code && tar -xzf /treb/code.tar.gz", "python3 -m venv",
             "python -m pip install -r requirements.txt", "exec python3 -S /treb/"]  # fmt: skip
    at = [script.index(part) for part in order]
    assert at == sorted(at), script
    check = subprocess.run([needs_program("shellcheck"), "-s", "sh", "-S", "warning", "-"],
                           input=script, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout


def test_code_dir_uses_the_image_code(tmp_path, capsys) -> None:
    code, out, err = render(tmp_path, capsys, "command: python t.py\n"
                            "kubernetes: {image: i, code_dir: /app}\n")  # fmt: skip
    assert code == 0, err
    docs = [d for d in yaml.safe_load_all(out) if d]
    validate(docs)
    (c,) = _pod(docs)["containers"]
    assert c["workingDir"] == "/app" and "tar" not in c["command"][2]
    assert list(docs[0]["binaryData"]) == [archive()[0]]
    assert "the code is the image's, in /app" in out


def test_code_too_big_for_a_config_map_is_refused(tmp_path, capsys) -> None:
    (tmp_path / "weights.bin").write_bytes(os.urandom(1 << 20))
    code, out, err = render(tmp_path, capsys, "command: x\nkubernetes: {image: i}\n")
    assert code == 2 and out == ""
    assert "more than the" in err and "kubernetes.code_dir" in err


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


class ApiException(Exception):
    """The shape of kubernetes.client.exceptions.ApiException: `status`, `reason`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status})\nReason: {reason}\n")
        self.status, self.reason = status, reason


class Cluster:
    """What the stand-in API server holds: objects by (kind, namespace, name), refused
    with 409 when the name is taken (as the real API answers), 404 when missing; deleting
    a Job deletes what its ownerReferences name (the real garbage collector's work)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.uids = 0

    def create(self, kind: str, ns: str, body: dict) -> dict:
        key = (kind, ns, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(409, f'Conflict: {kind} "{key[2]}" already exists')
        self.uids += 1
        stored = json.loads(json.dumps(body))
        stored["metadata"]["uid"] = f"uid-{self.uids}"
        self.objects[key] = stored
        return stored

    def delete(self, kind: str, ns: str, name: str) -> None:
        gone = self.objects.pop((kind, ns, name), None)
        if gone is None:
            raise ApiException(404, f'{kind} "{name}" not found')
        uid = gone["metadata"]["uid"]
        for key, obj in list(self.objects.items()):
            if any(o["uid"] == uid for o in obj["metadata"].get("ownerReferences", [])):
                del self.objects[key]

    def names(self, kind: str) -> list[str]:
        return sorted(name for k, _ns, name in self.objects if k == kind)


def _stand_in_client(monkeypatch, jobs: dict[str, list], calls: list,
                     refuse: str | None = None, pods: list | None = None,
                     cluster: Cluster | None = None) -> Cluster:  # fmt: skip
    """A stand-in for the official client (no Kubernetes cluster can run here): the real
    client's names and shapes; `jobs` per namespace from the test, and each Job created
    (active) added to them; each call that changes the cluster is recorded in `calls`;
    `refuse`: creating the Job is forbidden with this. Names are unique per kind and
    namespace, as in the real API (Cluster)."""
    cluster = cluster or Cluster()

    class BatchV1Api:
        def __init__(self, api: object = None) -> None:
            pass

        def create_namespaced_job(self, ns: str, body: dict) -> _Obj:
            calls.append(("create_job", ns, body))
            if refuse:
                raise ApiException(403, refuse)
            stored = cluster.create("Job", ns, body)
            jobs.setdefault(ns, []).append(_job(stored["metadata"]["name"], active=1))
            return _Obj(metadata=_Obj(name=stored["metadata"]["name"],
                                      uid=stored["metadata"]["uid"]))  # fmt: skip

        def list_namespaced_job(self, ns: str, label_selector: str = "") -> _Obj:
            calls.append((ns, label_selector))
            return _Obj(items=jobs.get(ns, []))

        def delete_namespaced_job(self, name: str, ns: str, body: object = None) -> None:
            calls.append(("delete_job", ns, name, body.propagation_policy))
            cluster.delete("Job", ns, name)
            jobs[ns] = [j for j in jobs.get(ns, []) if j.metadata.name != name]

    class CoreV1Api:
        def __init__(self, api: object = None) -> None:
            pass

        def create_namespaced_config_map(self, ns: str, body: dict) -> None:
            calls.append(("create_config_map", ns, body))
            cluster.create("ConfigMap", ns, body)

        def create_namespaced_service(self, ns: str, body: dict) -> None:
            calls.append(("create_service", ns, body))
            cluster.create("Service", ns, body)

        def patch_namespaced_config_map(self, name: str, ns: str, body: dict) -> None:
            calls.append(("patch_config_map", ns, name))
            cluster.objects[("ConfigMap", ns, name)]["metadata"].update(body["metadata"])

        def patch_namespaced_service(self, name: str, ns: str, body: dict) -> None:
            calls.append(("patch_service", ns, name))
            cluster.objects[("Service", ns, name)]["metadata"].update(body["metadata"])

        def delete_namespaced_config_map(self, name: str, ns: str) -> None:
            calls.append(("delete_config_map", ns, name))
            cluster.delete("ConfigMap", ns, name)

        def delete_namespaced_service(self, name: str, ns: str) -> None:
            calls.append(("delete_service", ns, name))
            cluster.delete("Service", ns, name)

        def list_namespaced_pod(self, ns: str, label_selector: str = "") -> _Obj:
            calls.append(("list_pods", ns, label_selector))
            return _Obj(items=[p for p, _log in pods or []])

        def read_namespaced_pod_log(self, name: str, ns: str) -> str:
            calls.append(("pod_log", ns, name))
            return {p.metadata.name: log for p, log in pods or []}[name]

    def create_from_yaml(api: object, yaml_objects: list, namespace: str) -> None:
        for doc in yaml_objects:  # the real utils' generic create, by kind
            make = {"Service": CoreV1Api().create_namespaced_service,
                    "Job": BatchV1Api().create_namespaced_job}[doc["kind"]]  # fmt: skip
            make(namespace, doc)

    client = types.ModuleType("kubernetes.client")
    client.BatchV1Api, client.CoreV1Api, client.ApiClient = BatchV1Api, CoreV1Api, object
    client.V1DeleteOptions = lambda propagation_policy: _Obj(propagation_policy=propagation_policy)
    config = types.ModuleType("kubernetes.config")
    config.load_kube_config = lambda: None
    utils = types.ModuleType("kubernetes.utils")
    utils.create_from_yaml = create_from_yaml
    pkg = types.ModuleType("kubernetes")
    pkg.client, pkg.config, pkg.utils = client, config, utils
    for name, mod in [("kubernetes", pkg), ("kubernetes.client", client),
                      ("kubernetes.config", config), ("kubernetes.utils", utils)]:  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    return cluster


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_run_creates_the_config_map_before_the_job_and_cancel_deletes_it(
    tmp_path, capsys, treb_home, monkeypatch
) -> None:
    """`treb run --on kubernetes`: the ConfigMap (the runtime archive whole, job.json with
    the run id) first, then the Service and the Job, all named after the run; the
    ConfigMap and Service then belong to the Job; all valid for Kubernetes 1.30.
    `treb cancel` deletes the Job, the Service and the ConfigMap."""
    calls: list = []
    cluster = _stand_in_client(monkeypatch, {}, calls)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: k\ncommand: python t.py\nnodes: 2\nkubernetes: {image: i}\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    assert main(["run", str(spec), "--on", "kubernetes", "--detach"]) == 0, capsys.readouterr()
    assert [c[0] for c in calls] == ["create_config_map", "create_service", "create_job",
                                     "patch_config_map", "patch_service"]  # fmt: skip
    configmap, service, job_doc = (calls[i][2] for i in range(3))
    assert {c[1] for c in calls} == {"default"}
    validate([configmap, service, job_doc])
    name, data = archive()
    assert base64.b64decode(configmap["binaryData"][name]) == data
    # the code archive holds the run's snapshot (job.yaml and t.py here)
    with tarfile.open(
        fileobj=io.BytesIO(base64.b64decode(configmap["binaryData"]["code.tar.gz"]))
    ) as tar:
        assert sorted(tar.getnames()) == ["job.yaml", "t.py"]
        assert tar.extractfile("t.py").read() == b"print(1)\n"
    job = json.loads(configmap["data"]["job.json"])
    run_id = job["run_id"]
    k8s = f"k-{run_id}"  # the workload's name and the run's id
    assert {d["metadata"]["name"] for d in (configmap, service, job_doc)} == {k8s}
    job_uid = cluster.objects[("Job", "default", k8s)]["metadata"]["uid"]
    for kind in ("ConfigMap", "Service"):
        owners = cluster.objects[(kind, "default", k8s)]["metadata"]["ownerReferences"]
        assert owners == [{"apiVersion": "batch/v1", "kind": "Job", "name": k8s, "uid": job_uid}]
    env = {
        e["name"]: e.get("value")
        for e in job_doc["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TREB_RUN_ID"] == run_id and job["nodes"] == 2
    assert env["MASTER_ADDR"] == f"{k8s}-0.{k8s}"
    manifests = treb_home / "runs" / run_id / "manifests.yaml"
    assert base64.b64encode(data).decode() in manifests.read_text()  # what was created
    calls.clear()
    assert main(["cancel", run_id]) == 0
    assert calls == [
        ("delete_job", "default", k8s, "Foreground"),
        ("delete_service", "default", k8s),  # gone with the Job already: a 404 is fine
        ("delete_config_map", "default", k8s),
    ]
    assert cluster.objects == {}


def test_two_runs_of_one_spec_do_not_collide(tmp_path, capsys, treb_home, monkeypatch) -> None:
    """The API refuses a name in use (409): each run's objects are named after the run
    (DNS-1035 labels of at most 50 characters, even for a long spec name); a run's
    Service and ConfigMap go once its Job has ended, the Job stays (its pods' logs)."""
    calls: list = []
    jobs: dict[str, list] = {}
    cluster = _stand_in_client(monkeypatch, jobs, calls)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: 9_very.long-experiment-name-that-goes-on-and-on-and-on-forever\n"
                    "command: python t.py\nkubernetes: {image: i}\n")  # fmt: skip
    for _ in range(2):
        assert main(["run", str(spec), "--on", "kubernetes", "--detach"]) == 0, (
            capsys.readouterr().err)  # fmt: skip
    names = cluster.names("Job")
    assert len(names) == 2 and names == cluster.names("Service") == cluster.names("ConfigMap")
    for name in names:
        assert DNS_1035.match(name) and len(name) <= 50, name
        assert name.startswith("treb-9-very-long-experiment")
    ids = {r.split()[0] for r in capsys.readouterr().out.split("\n") if r.strip()}
    assert {n.rsplit("-", 1)[1] for n in names} == ids
    # the first run's Job completes: the next refresh ends the run and cleans up after it
    first = next(j for j in jobs["default"] if j.metadata.name == names[0])
    first.status = _Obj(active=0, conditions=[_Obj(type="Complete", status="True",
                                                   reason=None, message=None)])  # fmt: skip
    assert main(["ps"]) == 0
    assert cluster.names("Job") == names
    assert cluster.names("Service") == cluster.names("ConfigMap") == [names[1]]


def test_a_name_in_use_is_refused_and_nothing_is_left(tmp_path, capsys, treb_home,
                                                      monkeypatch) -> None:  # fmt: skip
    """The stand-in answers 409 as the real API does: the run fails with the reason and
    deletes what it created before the refusal."""
    calls: list = []
    cluster = _stand_in_client(monkeypatch, {}, calls)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: k\ncommand: python t.py\nkubernetes: {image: i}\n")
    from trebuchet.backends.kubernetes.engine import run_name

    taken = run_name("k", "0badc0de")
    cluster.create("Service", "default", {"metadata": {"name": taken}})
    monkeypatch.setattr("trebuchet.launcher.submit.new_run_id", lambda: "0badc0de")
    code = main(["run", str(spec), "--on", "kubernetes", "--detach"])
    err = capsys.readouterr().err
    assert code == 2 and "(409)" in err and "already exists" in err
    assert cluster.names("ConfigMap") == [] and cluster.names("Job") == []


def test_config_map_is_deleted_when_the_job_is_refused(tmp_path, capsys, treb_home,
                                                       monkeypatch) -> None:  # fmt: skip
    calls: list = []
    cluster = _stand_in_client(monkeypatch, {}, calls, refuse="jobs.batch is forbidden")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: k\ncommand: python t.py\nkubernetes: {image: i}\n")
    assert main(["run", str(spec), "--on", "kubernetes", "--detach"]) == 2
    assert "jobs.batch is forbidden" in capsys.readouterr().err
    assert [c[0] for c in calls] == ["create_config_map", "create_service", "create_job",
                                     "delete_config_map", "delete_service"]  # fmt: skip
    assert cluster.objects == {}


def test_refresh_follows_jobs_with_one_list_call_per_namespace(treb_home, monkeypatch) -> None:
    from trebuchet.backends.kubernetes.engine import KubernetesBackend
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
    assert sorted(c for c in calls if len(c) == 2) == [
        ("default", "trebuchet.dev/workload"),
        ("ml", "trebuchet.dev/workload"),
    ]
    # the ended runs' Services and ConfigMaps are deleted (here: already gone, a 404)
    deleted = sorted(c[1:] for c in calls if c[0] in ("delete_service", "delete_config_map"))
    assert deleted == sorted([(ns, j) for ns, j in (("default", "b"), ("default", "c"),
                                                    ("ml", "d")) for _ in (1, 2)])  # fmt: skip
    states = {r.id: r.state for r in store.list()}
    assert states == {"a": "RUNNING", "b": "SUCCEEDED", "c": "FAILED", "d": "TIMEOUT", "e": "LOST"}
    assert store.attempts("c")[0]["reason"].startswith("BackoffLimitExceeded: Job has reached")
    assert "deleted outside trebuchet" in store.attempts("e")[0]["reason"]


def test_refresh_without_the_client_concludes_nothing(treb_home, monkeypatch) -> None:
    from trebuchet.backends.kubernetes.engine import KubernetesBackend
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


def _pod_obj(name: str, index: int, attempt: int, phase: str, exit_code: int | None = None,
         reason: str | None = None) -> _Obj:  # fmt: skip
    notes = {"batch.kubernetes.io/job-completion-index": str(index),
             "batch.kubernetes.io/job-index-failure-count": str(attempt)}  # fmt: skip
    end = None if exit_code is None else _Obj(exit_code=exit_code, reason=reason)
    state = _Obj(terminated=end)
    return _Obj(metadata=_Obj(name=name, annotations=notes),
                status=_Obj(phase=phase, reason=None,
                            container_statuses=[_Obj(name="trainer", state=state)]))  # fmt: skip


# What a pod's log holds: its node agent's output, rank lines labelled `[node:local]`
# (runtime/node/logcopy.py), the agent's own notes unlabelled.
POD1_ATTEMPT0 = (
    "[1:0] step 1\n[1:1] step 1\n[1:1] CUDA error: out of memory\ntreb: rank 3 (1:1) failed\n"
)
POD1_ATTEMPT1 = "[1:0] resumed\n[1:1] resumed\n[1:1] done\n"
POD0 = "[0:0] step 1\n[0:1] step 1\n[0:0] performance: 12.5 samples_per_second\n"


def test_logs_and_node_outcomes_come_from_the_pods(tmp_path, capsys, treb_home,
                                                   monkeypatch) -> None:  # fmt: skip
    """`treb logs` reads each pod's log through the API (a stand-in of the client: no
    cluster runs here) and shows it per rank and per attempt; `treb status` lists the
    pods' outcomes per node."""
    calls: list = []
    pods = [
        (_pod_obj("k-0-abc", 0, 0, "Running"), POD0),
        (_pod_obj("k-1-def", 1, 0, "Failed", 1, "Error"), POD1_ATTEMPT0),
        (_pod_obj("k-1-ghi", 1, 1, "Running"), POD1_ATTEMPT1),
    ]
    _stand_in_client(monkeypatch, {}, calls, pods=pods)  # the Job: active once created
    spec = tmp_path / "job.yaml"
    spec.write_text("name: k\ncommand: python t.py\nnodes: 2\nprocs_per_node: 2\nretries: 1\n"
                    "kubernetes: {image: i}\n")  # fmt: skip
    assert main(["run", str(spec), "--on", "kubernetes", "--detach"]) == 0
    capsys.readouterr()
    assert main(["logs", "--rank", "3", "--attempt", "1"]) == 0
    assert capsys.readouterr().out == "step 1\nCUDA error: out of memory\n"
    assert main(["logs", "--node", "0"]) == 0
    out = capsys.readouterr().out
    assert "[0:0] step 1" in out and "[0:1] step 1" in out and "performance: 12.5" in out
    run_dir = next((treb_home / "runs").iterdir())
    assert ("list_pods", "default", f"job-name=k-{run_dir.name}") in calls
    assert (run_dir / "attempt-1" / "rank-3.log").read_text() == "resumed\ndone\n"
    assert "treb: rank 3 (1:1) failed" in (run_dir / "attempt-0" / "agent-node-1.log").read_text()
    # a second sync appends nothing twice
    assert main(["logs", "--rank", "2", "--attempt", "2"]) == 0
    assert capsys.readouterr().out == "resumed\n"
    assert main(["status", "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert [(n["node"], n["attempt"], n["state"], n["exit_code"]) for n in nodes] == [
        (0, 0, "Running", None),
        (1, 0, "Failed", 1),
        (1, 1, "Running", None),
    ]
    assert nodes[1]["reason"] == "Error" and nodes[1]["name"] == "k-1-def"
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "nodes (as kubernetes reports them):" in text and "k-1-def" in text
