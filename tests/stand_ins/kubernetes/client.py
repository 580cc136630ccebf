"""`kubernetes.client` of the stand-in (the package's docstring): objects are created in
$TREB_STAND_IN_DIR; creating the Job runs its pods on the test hosts to their end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.*

from tests.engine_hosts import k8s_run_job  # noqa: E402

STATE = Path(os.environ.get("TREB_STAND_IN_DIR", "/nonexistent"))


def _path(ns: str, kind: str, name: str) -> Path:
    return STATE / ns / kind / f"{name}.json"


def _save(ns: str, kind: str, name: str, body: Any) -> None:
    path = _path(ns, kind, name)
    if path.exists():
        raise ApiException(409, f"{kind} {name} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def _load(ns: str, kind: str, name: str) -> Any:
    path = _path(ns, kind, name)
    if not path.exists():
        raise ApiException(404, f"{kind} {name} not found")
    return json.loads(path.read_text())


class ApiException(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status


class ApiClient:
    pass


class V1DeleteOptions:
    def __init__(self, **kw: Any) -> None:
        self.kw = kw


def _job_status(ran: dict[str, Any]) -> NS:
    cond = NS(type=ran["condition"], status="True", reason=ran["reason"], message=None)
    return NS(conditions=[cond], active=0)


class BatchV1Api:
    def __init__(self, api: Any = None) -> None:
        pass

    def create_namespaced_job(self, ns: str, job: dict[str, Any]) -> dict[str, Any]:
        name = job["metadata"]["name"]
        _save(ns, "jobs", name, job)
        workload = job["metadata"]["labels"]["trebuchet.dev/workload"]
        secret_file = STATE / ns / "secrets" / f"{workload}.json"
        secret = json.loads(secret_file.read_text()) if secret_file.exists() else {}
        docs = [_load(ns, "configmaps", name), _load(ns, "services", name), job]
        condition, reason, pods = k8s_run_job(docs, secret, STATE / ns / "pods" / name)
        ran = {
            "condition": condition,
            "reason": reason,
            "pods": {str(i): {"exit_code": c, "log": log} for i, (c, log) in pods.items()},
        }
        (STATE / ns / "jobs" / f"{name}.ran.json").write_text(json.dumps(ran))
        return {"metadata": {"name": name, "uid": f"uid-{name}"}}

    def _ran(self, ns: str, name: str) -> dict[str, Any]:
        return json.loads(_path(ns, "jobs", f"{name}.ran").read_text())

    def read_namespaced_job_status(self, name: str, ns: str) -> NS:
        return NS(status=_job_status(self._ran(ns, name)))

    def list_namespaced_job(self, ns: str, label_selector: str = "") -> NS:
        items = []
        for path in sorted((STATE / ns / "jobs").glob("*.ran.json")):
            name = path.name.removesuffix(".ran.json")
            items.append(NS(metadata=NS(name=name), status=_job_status(self._ran(ns, name))))
        return NS(items=items)

    def delete_namespaced_job(self, name: str, ns: str, body: Any = None) -> None:
        _path(ns, "jobs", name).unlink(missing_ok=True)


class CoreV1Api:
    def __init__(self, api: Any = None) -> None:
        pass

    def create_namespaced_config_map(self, ns: str, body: dict[str, Any]) -> None:
        _save(ns, "configmaps", body["metadata"]["name"], body)

    def create_namespaced_service(self, ns: str, body: dict[str, Any]) -> None:
        _save(ns, "services", body["metadata"]["name"], body)

    def patch_namespaced_config_map(self, name: str, ns: str, body: Any) -> None:
        _load(ns, "configmaps", name)

    def patch_namespaced_service(self, name: str, ns: str, body: Any) -> None:
        _load(ns, "services", name)

    def delete_namespaced_config_map(self, name: str, ns: str) -> None:
        _path(ns, "configmaps", name).unlink(missing_ok=True)

    def delete_namespaced_service(self, name: str, ns: str) -> None:
        _path(ns, "services", name).unlink(missing_ok=True)

    def list_namespaced_pod(self, ns: str, label_selector: str = "") -> NS:
        name = label_selector.removeprefix("job-name=")
        ran = BatchV1Api()._ran(ns, name)
        items = []
        for index, pod in sorted(ran["pods"].items()):
            end = NS(exit_code=pod["exit_code"], reason="Completed" if pod["exit_code"] == 0
                     else "Error")  # fmt: skip
            status = NS(
                phase="Succeeded" if pod["exit_code"] == 0 else "Failed",
                reason=None,
                container_statuses=[NS(name="trainer", state=NS(terminated=end))],
            )
            annotations = {
                "batch.kubernetes.io/job-completion-index": index,
                "batch.kubernetes.io/job-index-failure-count": "0",
            }
            meta = NS(name=f"{name}-{index}-x{index}", annotations=annotations)
            items.append(NS(metadata=meta, status=status))
        return NS(items=items)

    def read_namespaced_pod_log(self, pod: str, ns: str) -> str:
        job, _, rest = pod.rpartition("-x")
        name = job.rsplit("-", 1)[0]
        return str(BatchV1Api()._ran(ns, name)["pods"][rest]["log"])
