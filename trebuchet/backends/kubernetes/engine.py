"""Kubernetes: the spec as an indexed Job (one pod per node), a headless Service and a
ConfigMap that carries trebuchet's node agent and the run's code (code.py).

Pod i of Job J is reachable as J-i.J (the Service is named after the Job and is the pods'
subdomain), so MASTER_ADDR is the index-0 pod's name and NODE_RANK the pod's completion
index. Retries are the Job's, per index (backoffLimitPerIndex); TREB_ATTEMPT is the index's
failure count. Secrets come from a Secret named after the workload: trebuchet never writes
their values into a manifest. Rendering needs nothing installed; `treb run` creates the
objects with the official client and the current kubeconfig context.
"""

from __future__ import annotations

import base64
import contextlib
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import Backend, Submitted
from trebuchet.backends.job_file import (
    check_node_engine,
    engine_options,
    failed,
    grace_seconds,
    job_text,
    node_job,
    refuse_spares,
    require,
    running,
    start_lines,
    uses_secret,
)
from trebuchet.backends.kubernetes.code import ARCHIVE, CODE_DIR, CONFIGMAP_MAX, code_archive
from trebuchet.backends.node_setup import check_files, setup_lines
from trebuchet.errors import UserError
from trebuchet.launcher.runtime_file import archive
from trebuchet.runtime.contracts.rank_env import DEFAULT_MASTER_PORT
from trebuchet.store import lifecycle
from trebuchet.store.states import (
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    TIMEOUT,
)

if TYPE_CHECKING:
    from trebuchet.backends.kubernetes.options import Kubernetes
    from trebuchet.preflight.context import Context
    from trebuchet.preflight.findings import Finding
    from trebuchet.spec.load import LoadedSpec

AGENT_DIR = "/treb"  # the ConfigMap, read-only: the runtime archive and job.json
RUN_DIR = "/treb-run"  # an emptyDir: the node-local run directory (logs, records)
CHECKPOINTS = "/treb-checkpoints"  # where kubernetes.checkpoint_volume is mounted
# The index's failures so far (Kubernetes >= 1.29, with backoffLimitPerIndex): the attempt.
FAILURE_COUNT = "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"
GPU_RESOURCES = {"amd": "amd.com/gpu"}  # anything else (auto, nvidia): nvidia.com/gpu


LABEL = "trebuchet.dev/workload"
NAME_MAX = 50  # `<job>-<index>`, a pod's host name, must stay a DNS label (63)
RENDER_RUN_ID = "RUN_ID"  # `treb render`: the run id is not known yet


def gpu_resource(spec: Any) -> str:
    return GPU_RESOURCES.get(spec.gpu_vendor, "nvidia.com/gpu")


def k8s_name(name: str) -> str:
    """A DNS-1123 label short enough for `<job>-<index>` pod host names."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (out or "job")[:NAME_MAX].rstrip("-")


def run_name(spec_name: str, run_id: str) -> str:
    """The Job, Service and ConfigMap of one run: a second run of a spec must not collide
    with the first (the API refuses a name in use: 409). A DNS-1035 label (a Service name:
    a letter first); a run id too long to keep whole is shortened to a hash of it."""
    rid = k8s_name(run_id)
    if len(rid) > 16:
        import hashlib

        rid = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    base = k8s_name(spec_name)
    if not base[0].isalpha():
        base = "treb-" + base
    base = base[: NAME_MAX - len(rid) - 1].rstrip("-")
    return f"{base}-{rid}"


class KubernetesBackend(Backend):
    name = "kubernetes"

    def perf_fields(self, row: dict[str, Any]) -> dict[str, str]:
        return {"deployment_type": "k8s"}  # madengine's name for it

    def preflight(self, ctx: Context) -> list[Finding]:
        """A retried pod starts on a fresh node: checkpoints need a volume. (A pod always
        has an image, so the shared `node-environment-missing` cannot apply here.)"""
        from trebuchet.preflight import bare_nodes

        spec = ctx.spec
        if not spec.retries or spec.kubernetes.checkpoint_volume:
            return []
        how = f"retries: {spec.retries} starts a failed index again in a new pod"
        field = "kubernetes.checkpoint_volume"
        return bare_nodes.checkpoints_lost(ctx, "Kubernetes", how, field, "retries")

    def check(self, loaded: LoadedSpec) -> None:
        self.check_render(loaded)
        require("kubernetes", "kubernetes")

    def check_render(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        check_node_engine(spec, loaded, "Kubernetes")
        refuse_spares(spec, loaded, "Kubernetes")
        kube: Kubernetes = engine_options(spec, "kubernetes")
        if not (kube.image or (spec.environment and spec.environment.image)):
            raise loaded.refusal(
                "kubernetes.image",
                "a pod needs an image (set kubernetes.image or environment.image)",
            )
        env = spec.environment
        if env and env.mounts:
            raise loaded.refusal(
                "environment.mounts",
                "a pod cannot bind-mount host paths; "
                "use kubernetes.checkpoint_volume for checkpoints, other "
                "volumes with your own manifests",
            )
        check_files(loaded, "Kubernetes", "the workdir (the code archive, or code_dir)")

    def manifests(
        self,
        loaded: LoadedSpec,
        run_id: str = RENDER_RUN_ID,
        whole: bool = True,
        snapshot: Path | None = None,
    ) -> list[dict[str, Any]]:
        """ConfigMap, Service, Job. Not `whole` (render): the archives' base64 is elided."""
        self.check_render(loaded)
        spec = loaded.spec
        workload = k8s_name(spec.name)  # the Secret's name: one for every run of the spec
        name = run_name(spec.name, run_id)  # the Job's, Service's and ConfigMap's: this run's
        kube: Kubernetes = engine_options(spec, "kubernetes")
        ns = kube.namespace
        image = kube.image or spec.environment.image  # type: ignore[union-attr]
        port = spec.fixed_port or DEFAULT_MASTER_PORT
        labels = {LABEL: workload, "trebuchet.dev/run-id": k8s_name(run_id)}
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if ns:
            meta["namespace"] = ns
        runtime, data = archive()
        packed = base64.b64encode(data).decode() if whole else f"<{runtime}: treb run sends it>"
        ckpt = f"{CHECKPOINTS}/{run_id}" if kube.checkpoint_volume else None
        job_json = job_text(node_job(spec, run_id, ckpt))
        binary = {runtime: packed}
        if not kube.code_dir:  # the code travels in the ConfigMap (code.py)
            room = CONFIGMAP_MAX - len(base64.b64encode(data)) - len(job_json) - 4096
            tarball, count = code_archive(loaded.workdir, snapshot, room)
            binary[ARCHIVE] = (
                base64.b64encode(tarball).decode()
                if whole
                else f"<{ARCHIVE}: the {count} file(s) of the code snapshot: treb run sends it>"
            )
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {**meta, "labels": dict(labels)},
            "data": {"job.json": job_json},
            "binaryData": binary,
        }
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {**meta, "labels": dict(labels)},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"job-name": name},
                "ports": [{"name": "master", "port": port, "targetPort": port}],
            },
        }
        env: list[dict[str, Any]] = [
            {"name": s, "valueFrom": {"secretKeyRef": {"name": workload, "key": s}}}
            for s in spec.secrets
        ]
        for key, value in spec.env.items():
            if key in ("MASTER_PORT", "MASTER_ADDR"):
                continue  # set below, once
            if uses_secret(value, spec.secrets):
                continue  # expanded by the node agent (job.json's secret_env)
            env.append({"name": key, "value": value.replace("$(", "$$(")})
        env += [
            {"name": "NUM_NODES", "value": str(spec.nodes)},
            {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
            {"name": "MASTER_PORT", "value": str(port)},
            {"name": "TREB_RUN_ID", "value": run_id},
            {"name": "TREB_RUN_DIR", "value": RUN_DIR},
            {"name": "TREB_ATTEMPT", "valueFrom": {"fieldRef": {"fieldPath": FAILURE_COUNT}}},
        ]
        code = (
            []
            if kube.code_dir
            else [
                f"# the code snapshot (the ConfigMap's {ARCHIVE}), where the ranks start",
                f"cd {CODE_DIR} && tar -xzf {AGENT_DIR}/{ARCHIVE} || exit 1",
            ]
        )
        build, _ = setup_lines(loaded)
        no_python, start = start_lines(f"{AGENT_DIR}/{runtime}", f"{AGENT_DIR}/job.json")
        if build:
            build.insert(0, "# the environment, built in this pod before the ranks start")
        script = [
            "# trebuchet's node agent (the ConfigMap) runs this pod's ranks: "
            f"launcher {spec.launcher}, {spec.ranks_per_node} per node",
            'export NODE_RANK="$JOB_COMPLETION_INDEX" TREB_ATTEMPT="${TREB_ATTEMPT:-0}"',
            no_python,
            *code,
            *build,
            start,
        ]
        mounts = [
            {"name": "treb", "mountPath": AGENT_DIR, "readOnly": True},
            {"name": "treb-run", "mountPath": RUN_DIR},
            # a container's /dev/shm is 64 MiB: NCCL and DataLoader workers need more
            {"name": "dshm", "mountPath": "/dev/shm"},
        ]
        volumes: list[dict[str, Any]] = [
            {"name": "treb", "configMap": {"name": name}},
            {"name": "treb-run", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ]
        if not kube.code_dir:
            mounts.append({"name": "treb-code", "mountPath": CODE_DIR})
            volumes.append({"name": "treb-code", "emptyDir": {}})
        if kube.checkpoint_volume:
            mounts.append({"name": "treb-checkpoints", "mountPath": CHECKPOINTS})
            claim = {"claimName": kube.checkpoint_volume}
            volumes.append({"name": "treb-checkpoints", "persistentVolumeClaim": claim})
        container: dict[str, Any] = {
            "name": "trainer",
            "image": image,
            "command": ["sh", "-c", "\n".join(script) + "\n"],
            "env": env,
            "ports": [{"containerPort": port, "name": "master"}],
            "volumeMounts": mounts,
        }
        if kube.code_dir:
            container["workingDir"] = kube.code_dir
        container["resources"] = resources(spec, kube)
        if spec.hang_timeout:  # py-spy reads the ranks' stacks with ptrace (docs/hangs.md)
            container["securityContext"] = {"capabilities": {"add": ["SYS_PTRACE"]}}
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": spec.nodes,
            "parallelism": spec.nodes,
            # Retries per index: the index's failure count is then on each pod (TREB_ATTEMPT);
            # the first index that has used them all fails the Job.
            "backoffLimitPerIndex": spec.retries,
            "maxFailedIndexes": 0,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "subdomain": name,
                    "restartPolicy": "Never",
                    # the agent's grace period (TERM, then SIGKILL), then its records
                    "terminationGracePeriodSeconds": grace_seconds(spec) + 5,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        }
        if spec.timeout:
            job_spec["activeDeadlineSeconds"] = int(-(-spec.timeout // 1)) * (spec.retries + 1)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {**meta, "labels": dict(labels)},
            "spec": job_spec,
        }
        return [configmap, service, job]

    def render(self, loaded: LoadedSpec, docs: list[dict[str, Any]] | None = None) -> str:
        """The manifests as YAML; without `docs`, the render's (archive elided)."""
        import yaml

        from trebuchet.spec.dump import BlockDumper

        spec = loaded.spec
        workload = k8s_name(spec.name)
        whole = docs is not None
        docs = docs or self.manifests(loaded, whole=False)
        name = docs[0]["metadata"]["name"]
        kube: Kubernetes = engine_options(spec, "kubernetes")
        code_dir = kube.code_dir
        code = (
            f"its job.json; the code is the image's, in {code_dir}"
            if code_dir
            else f"its job.json and {ARCHIVE}, the code snapshot the pod unpacks into {CODE_DIR}"
        )
        head = (
            f"# Kubernetes manifests for {spec.name} ({loaded.source}).\n"
            f"# The Job, Service and ConfigMap are named after the run ({name!r}"
            f"{'' if whole else ': the run id comes with `treb run`'}); the Service and "
            "ConfigMap go with the Job.\n"
            f"# The ConfigMap carries trebuchet's node agent (the runtime archive), "
            f"{code}{'' if whole else ' (archives elided here)'}.\n"
            f"# GPUs as {gpu_resource(spec)}.\n"
        )
        if spec.secrets:
            keys = " ".join(f'--from-literal={s}="${s}"' for s in spec.secrets)
            head += (
                f"# Secrets come from the Secret {workload!r} (one for every run of the spec), "
                f"one key per name; create it first:\n"
                f"#   kubectl create secret generic {workload} {keys}\n"
            )
        text = [yaml.dump(m, Dumper=BlockDumper, sort_keys=False, width=1000) for m in docs]
        return head + "---\n" + "---\n".join(text)

    def submit(self, sub: Any, attach: bool) -> Submitted:
        require("kubernetes", "kubernetes", sub)
        from kubernetes import client, config

        from trebuchet.store.files import write_atomic

        snapshot = sub.run_dir / "code" if sub.loaded.spec.snapshot else None
        docs = self.manifests(sub.loaded, sub.record.id, snapshot=snapshot)
        write_atomic(sub.run_dir / "manifests.yaml", self.render(sub.loaded, docs))
        configmap, service, job = docs
        name = job["metadata"]["name"]
        ns = sub.loaded.spec.kubernetes.namespace or "default"
        made: list[str] = []
        try:
            config.load_kube_config()
            api = client.ApiClient()
            core = client.CoreV1Api(api)
            batch = client.BatchV1Api(api)
            core.create_namespaced_config_map(ns, configmap)  # before the pods that mount it
            made.append("config_map")
            core.create_namespaced_service(ns, service)  # before the pods look up their peers
            made.append("service")
            created = batch.create_namespaced_job(ns, job)
        except Exception as exc:  # config, auth, API errors (409: the name is taken): recorded
            for kind in made:  # nothing is left behind for a Job that was not created
                with contextlib.suppress(Exception):
                    getattr(core, f"delete_namespaced_{kind}")(name, ns)
            why = " ".join(str(exc).split())[:500]
            failed(sub, f"Kubernetes refused the manifests: {why}")
            raise UserError(f"--on kubernetes: could not apply the manifests: {why}") from None
        _owned_by(core, ns, name, created)
        running(sub, "kubernetes", f"{ns}/{name}", job=name, namespace=ns)
        if not attach:
            return Submitted(sub.record.id)
        while True:  # the Job's own conditions say how it ended
            state, reason = job_state(batch.read_namespaced_job_status(name, ns).status)
            if state in TERMINAL:
                break
            time.sleep(5)
        # the pods' logs, before the end's diagnosis reads them (node_logs.py)
        self.sync_logs(sub.store, sub.store.get(sub.record.id))
        lifecycle.follow(sub.store, sub.record.id, state, reason)
        _clean_up(core, ns, name)
        return Submitted(sub.record.id, state)

    def refresh(self, store: Any, runs: list[Any]) -> None:
        """Active runs' states from their Jobs: one list call per namespace, for all."""
        active = [r for r in runs if r.active and r.backend == self.name and r.backend_id]
        if not active:
            return
        try:
            from kubernetes import client, config

            config.load_kube_config()
        except Exception:  # no client, no kubeconfig: nothing can be concluded
            return

        batch = client.BatchV1Api()
        by_ns: dict[str, list[Any]] = {}
        for rec in active:
            by_ns.setdefault(rec.backend_id.partition("/")[0], []).append(rec)
        for ns, recs in by_ns.items():
            try:
                jobs = batch.list_namespaced_job(ns, label_selector=LABEL).items
            except Exception:  # API unreachable: conclude nothing
                continue
            found = {j.metadata.name: j for j in jobs}
            for rec in recs:
                name = rec.backend_id.partition("/")[2]
                job = found.get(name)
                reason: str | None
                if job is None:
                    state, reason = LOST, "its Job is gone (deleted outside trebuchet?)"
                else:
                    state, reason = job_state(job.status)
                lifecycle.follow(store, rec.id, state, reason)
                if job is not None and state in TERMINAL:  # once: the run is no longer active
                    _clean_up(client.CoreV1Api(), ns, name)

    def _pods(self, run: Any) -> tuple[Any, str, list[Any]] | None:
        """(CoreV1Api, namespace, the Job's pods by index then attempt), or None."""
        ns, _, name = (run.backend_id or "").partition("/")
        if not name:
            return None
        try:
            from kubernetes import client, config

            config.load_kube_config()
            core = client.CoreV1Api()
            pods = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        except Exception:  # no client, no kubeconfig, API unreachable: nothing to read
            return None
        return core, ns, sorted(pods, key=lambda p: (_index(p), _attempt(p)))

    def sync_logs(self, store: Any, run: Any) -> None:
        """Each pod's log (its node agent's output) split into the per-rank logs of its
        attempt (node_logs.py); a pod already gone keeps what was synced."""
        from trebuchet.backends.node_logs import split, write

        got = self._pods(run)
        if got is None:
            return
        core, ns, pods = got
        ppn = max(1, run.procs_per_node)
        for pod in pods:
            if (pod.status.phase or "") == "Pending":
                continue  # no container has started: no log yet
            try:
                text = core.read_namespaced_pod_log(pod.metadata.name, ns)
            except Exception:
                continue
            write(Path(run.run_dir), _attempt(pod), split(text or "", ppn, _index(pod)))

    def node_outcomes(self, store: Any, run: Any) -> list[dict[str, Any]] | None:
        got = self._pods(run)
        if got is None:
            return None
        rows = []
        for pod in got[2]:
            end = _terminated(pod)
            rows.append({
                "node": _index(pod), "attempt": _attempt(pod), "name": pod.metadata.name,
                "state": pod.status.phase or "Unknown",
                "exit_code": getattr(end, "exit_code", None),
                "reason": getattr(end, "reason", None) or pod.status.reason,
            })  # fmt: skip
        return rows

    def cancel(self, store: Any, run: Any) -> None:
        require("kubernetes", "kubernetes")
        from kubernetes import client, config

        ns, _, name = (run.backend_id or "").partition("/")
        if not name:
            raise UserError(f"run {run.id} has no Kubernetes Job recorded")
        config.load_kube_config()
        body = client.V1DeleteOptions(propagation_policy="Foreground")
        try:
            client.BatchV1Api().delete_namespaced_job(name, ns, body=body)
        except Exception as exc:  # gone already (404) is what a cancel wants
            if getattr(exc, "status", None) != 404:
                why = " ".join(str(exc).split())[:500]
                raise UserError(f"run {run.id}: Kubernetes kept Job {name}: {why}") from None
        _clean_up(client.CoreV1Api(), ns, name)  # also when the Job's owner links were not set
        lifecycle.ended(store, run.id, "CANCELLED", "treb cancel")


def resources(spec: Any, kube: Kubernetes) -> dict[str, Any]:
    """The container's requests and limits: GPUs as a limit (also the request), one CPU
    per rank unless kubernetes.cpu says, memory a request, not a limit."""
    out: dict[str, dict[str, str]] = {}
    if spec.gpus_per_node > 0:
        out["limits"] = {gpu_resource(spec): str(spec.gpus_per_node)}
    requests = {"cpu": str(kube.cpu or spec.ranks_per_node)}
    if kube.memory:
        requests["memory"] = kube.memory
    out["requests"] = requests
    return out


def _owned_by(core: Any, ns: str, name: str, job: Any) -> None:
    """The ConfigMap and Service belong to the Job: deleting the Job (kubectl, its TTL)
    deletes them too. Best effort: the end and a cancel also delete them (_clean_up)."""
    meta = job.get("metadata") if isinstance(job, dict) else getattr(job, "metadata", None)
    uid = meta.get("uid") if isinstance(meta, dict) else getattr(meta, "uid", None)
    if not uid:
        return
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}
    patch = {"metadata": {"ownerReferences": [owner]}}
    for kind in ("config_map", "service"):
        with contextlib.suppress(Exception):
            getattr(core, f"patch_namespaced_{kind}")(name, ns, patch)


def _clean_up(core: Any, ns: str, name: str) -> None:
    """The run's Service and ConfigMap once its Job ended (the Job stays: its pods' logs
    are `treb logs`'); gone already is fine."""
    for kind in ("service", "config_map"):
        with contextlib.suppress(Exception):
            getattr(core, f"delete_namespaced_{kind}")(name, ns)


def _annotation(pod: Any, key: str) -> int:
    value = str((pod.metadata.annotations or {}).get(f"batch.kubernetes.io/{key}"))
    return int(value) if value.isdigit() else 0


def _index(pod: Any) -> int:
    """The pod's completion index: its node rank."""
    return _annotation(pod, "job-completion-index")


def _attempt(pod: Any) -> int:
    """The index's failures before this pod: its attempt (TREB_ATTEMPT in the pod)."""
    return _annotation(pod, "job-index-failure-count")


def _terminated(pod: Any) -> Any:
    """The trainer container's `terminated` state, or None while it runs."""
    for cs in pod.status.container_statuses or []:
        if cs.name == "trainer" and cs.state is not None:
            return cs.state.terminated
    return None


def job_state(status: Any) -> tuple[str, str | None]:
    """(trebuchet state, reason) of an indexed Job from its status and conditions."""
    for cond in status.conditions or []:
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            return SUCCEEDED, None
        if cond.type == "Failed":
            why = f"{cond.reason or 'failed'}: {cond.message or ''}".strip(": ")
            return (TIMEOUT if cond.reason == "DeadlineExceeded" else FAILED), why
    if status.active:
        return RUNNING, None
    return PENDING, None


BACKEND = KubernetesBackend()
