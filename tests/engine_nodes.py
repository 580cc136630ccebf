"""What SkyPilot and Kubernetes run on each node, run here as real processes.

No SkyPilot cluster and no Kubernetes cluster run on this machine, so the tests stand in
for exactly what the engine would do, and nothing more:
- SkyPilot: the rendered `run:` section in bash, with the variables SkyPilot gives a task
  (SKYPILOT_NODE_RANK, SKYPILOT_NUM_NODES, SKYPILOT_NODE_IPS, the task's envs and secrets)
  and the file_mounts' sources copied to their destinations under a temporary HOME, in the
  workdir (SkyPilot runs `run:` in the uploaded workdir).
- Kubernetes: the pod command with JOB_COMPLETION_INDEX and the container's env (the
  secrets' values and the downward API's annotation value given by the test), the
  ConfigMap's files written into a folder that stands for its mount (/treb), and folders
  for the emptyDirs (/treb-run, /treb-code: the pod unpacks the code archive there). The
  Service's DNS name for pod 0 is 127.0.0.1 here.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trebuchet.backends.kubernetes.code import CODE_DIR
from trebuchet.backends.kubernetes.engine import AGENT_DIR, RUN_DIR, KubernetesBackend
from trebuchet.backends.skypilot.engine import SkyPilotBackend
from trebuchet.spec.load import LoadedSpec, load_spec

BIN = str(Path(sys.executable).parent)  # `python` for the ranks: this interpreter's


def load(path: Path, *overrides: str) -> LoadedSpec:
    return load_spec(path, list(overrides))


def spec_file(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.yaml"
    path.write_text(text)
    return path


def sky_task(loaded: LoadedSpec, run_dir: Path, run_id: str = "r1") -> dict[str, Any]:
    """The task `treb run --on skypilot` hands over, its files written as submit does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return SkyPilotBackend().prepare_task(loaded, run_id, run_dir)


def sky_node(
    task: dict[str, Any], home: Path, node: int, nodes: int, ips: str = "127.0.0.1\n127.0.0.1",
    env: dict[str, str] | None = None, path: str | None = None,
) -> subprocess.Popen:  # fmt: skip
    """One node's `run:` as SkyPilot starts it (the module's docstring); stdout, stderr piped."""
    for dest, src in task["file_mounts"].items():
        if isinstance(src, dict):  # a bucket: the test says where it stands (job.json)
            continue
        target = home / dest.removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    full = {
        "PATH": path or f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(home),
        "SKYPILOT_NODE_RANK": str(node),
        "SKYPILOT_NUM_NODES": str(nodes),
        "SKYPILOT_NODE_IPS": ips,
        **{k: str(v) for k, v in task["envs"].items()},
        **(env or {}),
    }
    return subprocess.Popen(
        ["bash", "-c", task["run"]], env=full, cwd=task["workdir"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def k8s_pod(
    docs: list[dict[str, Any]], root: Path, index: int, workdir: Path, failure_count: str = "",
    secrets: dict[str, str] | None = None, path: str | None = None,
) -> subprocess.Popen:  # fmt: skip
    """One pod of the indexed Job (the module's docstring): `root/treb` stands for the
    ConfigMap's mount, `root/treb-run` and `root/treb-code` for the emptyDirs, `workdir`
    for the image's working directory (where the ranks start with kubernetes.code_dir)."""
    configmap, _service, job = docs
    mount, run_dir, code = root / "treb", root / "treb-run", root / "treb-code"
    mount.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    code.mkdir(exist_ok=True)
    for name, text in configmap["data"].items():
        (mount / name).write_text(text)
    for name, packed in configmap["binaryData"].items():
        (mount / name).write_bytes(base64.b64decode(packed, validate=True))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {"PATH": path or f"{BIN}{os.pathsep}{os.environ['PATH']}", "HOME": str(root),
           "JOB_COMPLETION_INDEX": str(index)}  # fmt: skip
    for item in container["env"]:
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref:
            env[item["name"]] = (secrets or {})[ref["secretKeyRef"]["key"]]
        elif "fieldRef" in ref:  # the downward API: "" when the annotation is absent
            env[item["name"]] = failure_count
        else:
            env[item["name"]] = item["value"].replace("$$(", "$(")  # Kubernetes' escape
    env["MASTER_ADDR"] = "127.0.0.1"  # the Service's name for pod 0
    assert env["TREB_RUN_DIR"] == RUN_DIR
    env["TREB_RUN_DIR"] = str(run_dir)
    shell, flag, script = container["command"]
    script = script.replace(f"{AGENT_DIR}/", f"{mount}/").replace(f"cd {CODE_DIR} ", f"cd {code} ")
    return subprocess.Popen(
        [shell, flag, script], env=env, cwd=str(workdir), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def k8s_docs(loaded: LoadedSpec, run_id: str = "r1") -> list[dict[str, Any]]:
    """The manifests `treb run --on kubernetes` creates (the archive whole)."""
    return KubernetesBackend().manifests(loaded, run_id)


@contextlib.contextmanager
def started(*procs: subprocess.Popen) -> Iterator[tuple[subprocess.Popen, ...]]:
    """Node processes that are ended (their whole process group) however the test ends."""
    try:
        yield procs
    finally:
        for p in procs:  # the ranks die with their agent (PDEATHSIG)
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            for pipe in (p.stdout, p.stderr):
                if pipe:
                    pipe.close()


def finish(p: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err
