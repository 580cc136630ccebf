"""SkyPilot's and Kubernetes' nodes on the ssh test hosts: what those engines run on a node,
run there verbatim, with the environment they give it.

The hosts (tests/ssh_hosts/hosts.sh) are network namespaces with their own addresses
(ts1 10.78.0.11, ts2 10.78.0.12). A node here is a process entered into one of them
(nsenter --net) with its own UTS and mount namespaces (unshare): its own host name and
/etc/hosts, and, for a pod, its own root: an overlay of this machine's root (a
container's image, here the one that holds python and torch) on which the rendered
volume paths exist: the ConfigMap's files read-only at /treb, the emptyDirs at /treb-run
and /treb-code, a memory-backed /dev/shm. The sshd of the hosts is not used: an engine
does not start its nodes' work over ssh as a login.

What cannot exist here is the engines' control planes (a SkyPilot API server with a Ray
cluster, a Kubernetes API server with its Job controller and kubelets). The stand-ins
for them (tests/stand_ins/sky, tests/stand_ins/kubernetes: the SDKs trebuchet imports)
do what those planes do to a node and nothing more, as their sources and docs say:
- SkyPilot (sky/backends/task_codegen.py, sky/skylet/log_lib.py and subprocess_daemon.py):
  file_mounts copied to their destinations under the node's HOME, the workdir synced to
  ~/sky_workdir; `setup:` on every node first (task envs, secrets, SKYPILOT_NUM_NODES),
  in ~/sky_workdir, `unset CUDA_VISIBLE_DEVICES;` before it; then `run:` on every node in
  ~/sky_workdir with the task envs, secrets, PYTHONUNBUFFERED=1, SKYPILOT_NODE_RANK,
  SKYPILOT_NODE_IPS (the nodes' internal IPs, head first, joined by newlines),
  SKYPILOT_NUM_NODES, SKYPILOT_NUM_GPUS_PER_NODE (0 without accelerators),
  SKYPILOT_TASK_ID, SKYPILOT_INTERNAL_JOB_ID, SKYPILOT_CLUSTER_INFO. The first node
  that ends with a non-zero code gets the others cancelled: SIGTERM to each one's
  process and every descendant, SIGKILL 30 s later. The job's log is the nodes' lines,
  each prefixed as SkyPilot's log_lib does: `(head, rank=0, pid=P) `,
  `(worker1, rank=1, pid=P, ip=IP) `, `(setup pid=P) `.
- Kubernetes (Indexed Job, headless Service, ConfigMap volume): one pod per index on
  its own host, named `<job>-<index>` (its host name); /etc/hosts as the kubelet writes
  it plus the Service's records for every pod (`<job>-<i>.<service>` and the
  namespace's FQDN: what cluster DNS answers); the container's command, args, env
  (values, secretKeyRef from the Secret, fieldRef of the failure-count annotation,
  $(VAR) references), workingDir (else the image's: /), JOB_COMPLETION_INDEX and
  HOSTNAME. A pod whose container fails ends its index (backoffLimitPerIndex 0): with
  maxFailedIndexes 0 the Job fails and its other pods are deleted: SIGTERM to the
  container's main process, SIGKILL to all after terminationGracePeriodSeconds.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STAND_INS = REPO / "tests" / "stand_ins"
BIN = str(Path(sys.executable).parent)  # the image's python: this one, with torch
NETNS = Path("/var/run/netns")
HOST_IP = {f"ts{i}": f"10.78.0.1{i}" for i in range(1, 10)}
SKY_WORKDIR = "sky_workdir"  # under the node's HOME (sky.skylet.constants.SKY_REMOTE_WORKDIR)
KILL_AFTER_S = 30.0  # SkyPilot's subprocess daemon: SIGKILL 30 s after the SIGTERM


def hosts_up() -> list[str]:
    """The test hosts' names (TREB_SSH_HOSTS, as scripts/with-ssh-hosts exports it)."""
    names = os.environ.get("TREB_SSH_HOSTS", "ts1 ts2").split()
    return [h for h in names if (NETNS / h).exists()]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc's children lists), deepest last."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def signal_tree(pid: int, sig: int) -> None:
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


class Node:
    """One node's process on a test host, its output kept line by line with a prefix."""

    def __init__(
        self,
        host: str,
        name: str,
        hosts_text: str,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        scratch: Path,
        mounts: dict[str, tuple[Path, bool]] | None = None,
    ) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        hosts_file = scratch / "hosts"
        hosts_file.write_text(hosts_text)
        q = shlex.quote
        run = (f"cd {q(cwd)} && exec env -i "
               + " ".join(q(f"{k}={v}") for k, v in env.items()) + " "
               + " ".join(map(q, argv)))  # fmt: skip
        lines = ["set -e", f"hostname {q(name)}"]
        if mounts is None:  # a VM: this machine's root, its own /etc/hosts
            lines += [f"mount --bind {q(str(hosts_file))} /etc/hosts", run]
        else:  # a container: its own root, with the pod's volumes where the spec says
            fs = scratch / "root"
            fs.mkdir(exist_ok=True)
            top = f"{fs}/m"
            lines += [
                f"mount -t tmpfs tmpfs {q(str(fs))}",
                f"mkdir {fs}/u {fs}/w {top}",
                f"mount -t overlay overlay -o lowerdir=/,upperdir={fs}/u,workdir={fs}/w {top}",
                *(f"mount --rbind /{d} {top}/{d}" for d in ("proc", "dev", "sys")),
                f"mount -t tmpfs -o size=256m shm {top}/dev/shm",
                f"mount --bind {q(str(hosts_file))} {top}/etc/hosts",
            ]
            for target, (source, read_only) in mounts.items():
                lines += [f"mkdir -p {top}{target}", f"mount --bind {q(str(source))} {top}{target}"]
                if read_only:
                    lines.append(f"mount -o remount,bind,ro {top}{target}")
            lines.append(f"exec chroot {top} sh -c {q(run)}")
        argv_ = ["nsenter", f"--net={NETNS / host}", "unshare", "--uts", "--mount",
                 "--propagation", "private", "sh", "-c", "\n".join(lines)]  # fmt: skip
        self.host, self.name = host, name
        self.proc = subprocess.Popen(
            argv_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def wait(self, timeout: float | None = None) -> int:
        rc = self.proc.wait(timeout)
        self.reader.join(10)
        return rc

    def end(self) -> None:
        """However the test ends: the node's processes are gone."""
        if self.proc.poll() is None:
            signal_tree(self.proc.pid, signal.SIGKILL)
        self.wait(30)


def first_failure_teardown(
    nodes: list[Node], stop: Any, kill_after: float, timeout: float = 120
) -> list[int]:
    """Wait for the nodes as the engines' control planes do: when one ends with a non-zero
    code, `stop(node)` the others, and SIGKILL the trees still there `kill_after` seconds
    later. Returns each node's own exit code."""
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    while True:
        codes = [n.proc.poll() for n in nodes]
        if all(c is not None for c in codes):
            break
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
            for n, c in zip(nodes, codes, strict=True):
                if c is None:
                    stop(n)
        if failed_at is not None and time.monotonic() > failed_at + kill_after:
            for n in nodes:
                if n.proc.poll() is None:
                    signal_tree(n.proc.pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            for n in nodes:
                n.end()
            raise AssertionError("the nodes did not end")
        time.sleep(0.1)
    return [n.wait() for n in nodes]


# ---- SkyPilot


def vm_env(home: Path) -> dict[str, str]:
    """What a cloud VM's user has before SkyPilot adds its own (the image's python)."""
    return {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "USER": "root",
            "LANG": "C.UTF-8"}  # fmt: skip


def sky_hosts_text(hosts: list[str]) -> str:
    """A VM's /etc/hosts: its own name resolves (gloo looks it up), as the clouds' do."""
    return "127.0.0.1 localhost\n" + "".join(f"{HOST_IP[h]} {h}\n" for h in hosts)


def sky_copy_files(task: dict[str, Any], home: Path) -> None:
    """file_mounts (local sources) and the workdir, as SkyPilot syncs them to a node."""
    import shutil

    for dest, src in task.get("file_mounts", {}).items():
        if isinstance(src, dict):
            continue
        target = home / dest.removeprefix("~/") if dest.startswith("~/") else Path(dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    shutil.copytree(task["workdir"], home / SKY_WORKDIR, dirs_exist_ok=True)


def sky_prefix(rank: int, pid: int, ip: str, setup: bool = False) -> str:
    """The prefix SkyPilot's log_lib gives each line of a node (its comments, verbatim)."""
    if setup:
        text = f"(setup pid={pid})" if rank == 0 else f"(setup pid={pid}, ip={ip})"
    elif rank == 0:
        text = f"(head, rank=0, pid={pid})"
    else:
        text = f"(worker{rank}, rank={rank}, pid={pid}, ip={ip})"
    return f"\x1b[36m{text}\x1b[0m"  # colorama's CYAN, RESET_ALL


def sky_run_job(
    task: dict[str, Any], secrets: dict[str, str], root: Path, job_id: int, cluster: str
) -> tuple[int, str, list[int]]:
    """The task on the test hosts as SkyPilot runs it (the module's docstring): (the job's
    exit code as `sky.tail_logs` returns it: 0, or 100 when it failed, the job's log, and
    each node's exit code)."""
    count = int(task.get("num_nodes", 1))
    hosts = hosts_up()[:count]
    assert len(hosts) == count, f"{count} nodes asked, test hosts up: {hosts}"
    ips = [HOST_IP[h] for h in hosts]
    homes = [root / f"node-{i}" for i in range(count)]
    for home in homes:
        sky_copy_files(task, home)
    envs = {k: "" if v is None else str(v) for k, v in (task.get("envs") or {}).items()}
    envs.update(secrets)
    task_id = f"sky-2026-01-01-00-00-00-000000_{cluster}_{job_id}"
    log: list[str] = []
    names = sky_hosts_text(hosts)

    def start(i: int, script: str, extra: dict[str, str], kind: str) -> Node:
        path = homes[i] / f".sky_app_{kind}_{job_id}.sh"
        path.write_text(f"#!/bin/bash\ncd ~/{SKY_WORKDIR}\n{script}")
        env = {**vm_env(homes[i]), "PYTHONUNBUFFERED": "1", **envs, **extra}
        return Node(hosts[i], hosts[i], names, ["/bin/bash", str(path)], env,
                    str(homes[i]), root / "scratch" / f"{kind}-{i}")  # fmt: skip

    def collect(nodes: list[Node], setup: bool) -> None:
        for i, n in enumerate(nodes):
            prefix = sky_prefix(i, n.proc.pid, ips[i], setup)
            log.extend(f"{prefix} {line}" for line in n.lines)

    if task.get("setup"):
        script = "unset CUDA_VISIBLE_DEVICES; " + task["setup"]
        nodes = [start(i, script, {"SKYPILOT_NUM_NODES": str(count)}, "setup")
                 for i in range(count)]  # fmt: skip
        try:
            codes = first_failure_teardown(nodes, lambda n: signal_tree(n.proc.pid,
                                           signal.SIGTERM), KILL_AFTER_S)  # fmt: skip
        finally:
            for n in nodes:
                n.end()
        collect(nodes, True)
        if any(codes):
            return 100, "\n".join(log) + "\n", codes
    gpus = str(task.get("resources", {}).get("accelerators", ":0")).partition(":")[2] or "1"
    run_env = {
        "SKYPILOT_NODE_IPS": "\n".join(ips),
        "SKYPILOT_NUM_NODES": str(count),
        "SKYPILOT_NUM_GPUS_PER_NODE": gpus,
        "SKYPILOT_TASK_ID": task_id,
        "SKYPILOT_INTERNAL_JOB_ID": str(job_id),
        "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": cluster, "num_nodes": count}),
    }
    nodes = [start(i, task["run"], {**run_env, "SKYPILOT_NODE_RANK": str(i)}, "run")
             for i in range(count)]  # fmt: skip
    try:
        codes = first_failure_teardown(
            nodes, lambda n: signal_tree(n.proc.pid, signal.SIGTERM), KILL_AFTER_S
        )
    finally:
        for n in nodes:
            n.end()
    collect(nodes, False)
    return (100 if any(codes) else 0), "\n".join(log) + "\n", codes


# ---- Kubernetes


def configmap_volume(configmap: dict[str, Any], folder: Path) -> Path:
    """The ConfigMap's keys as the kubelet writes a configMap volume: files in a timestamped
    folder, `..data` pointing at it, each key a link through `..data` (mode 0644)."""
    data = folder / "..2026_01_01_00_00_00.000000000"
    data.mkdir(parents=True)
    for name, text in (configmap.get("data") or {}).items():
        (data / name).write_text(text)
    for name, packed in (configmap.get("binaryData") or {}).items():
        (data / name).write_bytes(base64.b64decode(packed, validate=True))
    (folder / "..data").symlink_to(data.name)
    for name in [*(configmap.get("data") or {}), *(configmap.get("binaryData") or {})]:
        (data / name).chmod(0o644)
        (folder / name).symlink_to(f"..data/{name}")
    return folder


def expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) of a variable defined before, as Kubernetes expands env values ($$: a $)."""
    import re

    return re.sub(
        r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))",
        lambda m: "$" if m.group(1) == "$" else env.get(m.group(2), m.group(0)),
        value,
    )


def pod_env(
    container: dict[str, Any], index: int, hostname: str, secret: dict[str, str],
    failure_count: str,
) -> dict[str, str]:  # fmt: skip
    """The container's environment as the kubelet builds it: the image's, the Job
    controller's JOB_COMPLETION_INDEX, HOSTNAME, then the container's env in order."""
    env = {"PATH": f"{BIN}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "LANG": "C.UTF-8", "HOSTNAME": hostname,
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}  # fmt: skip
    env["JOB_COMPLETION_INDEX"] = str(index)
    for item in container.get("env", []):
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref:
            env[item["name"]] = secret[ref["secretKeyRef"]["key"]]
        elif "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            assert "job-index-failure-count" in path, path
            env[item["name"]] = failure_count
        else:
            env[item["name"]] = expand(item["value"], env)
    return env


def k8s_hosts_text(job: str, service: str, ns: str, hosts: list[str], index: int) -> str:
    """The kubelet's /etc/hosts of pod `index`, and the Service's DNS records of every pod
    (what cluster DNS answers: `<job>-<i>.<service>` through the search path)."""
    lines = ["127.0.0.1 localhost"]
    for i, h in enumerate(hosts):
        name = f"{job}-{i}"
        fqdn = f"{name}.{service}.{ns}.svc.cluster.local"
        if i == index:
            lines.append(f"{HOST_IP[h]} {fqdn} {name}")
        lines.append(f"{HOST_IP[h]} {name}.{service} {fqdn}")
    return "\n".join(lines) + "\n"


def k8s_run_job(
    docs: list[dict[str, Any]], secret: dict[str, str], root: Path
) -> tuple[str, str | None, dict[int, tuple[int, str]]]:
    """The manifests' pods on the test hosts (the module's docstring): (the Job's condition
    Complete or Failed, its reason, {index: (exit code, the pod's log)})."""
    configmap, service, job = docs
    name = job["metadata"]["name"]
    ns = job["metadata"].get("namespace", "default")
    spec = job["spec"]
    tmpl = spec["template"]["spec"]
    count = int(spec["completions"])
    hosts = hosts_up()[:count]
    assert len(hosts) == count, f"{count} pods asked, test hosts up: {hosts}"
    assert (
        tmpl["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    )
    assert service["spec"]["selector"] == {"job-name": name}  # the pods get DNS records
    (container,) = tmpl["containers"]
    grace = float(tmpl.get("terminationGracePeriodSeconds", 30))
    volumes = {v["name"]: v for v in tmpl["volumes"]}
    pods = []
    for i, host in enumerate(hosts):
        pod = root / f"pod-{i}"
        mounts: dict[str, tuple[Path, bool]] = {}
        for m in container["volumeMounts"]:
            vol = volumes[m["name"]]
            if "configMap" in vol:
                assert vol["configMap"]["name"] == configmap["metadata"]["name"]
                src = configmap_volume(configmap, pod / "volumes" / m["name"])
            elif "emptyDir" in vol:
                if vol["emptyDir"].get("medium") == "Memory" and m["mountPath"] == "/dev/shm":
                    continue  # the overlay root's /dev/shm is a fresh tmpfs already
                src = pod / "volumes" / m["name"]
                src.mkdir(parents=True)
            else:
                raise AssertionError(f"no stand-in for volume {vol}")
            mounts[m["mountPath"]] = (src, bool(m.get("readOnly")))
        hostname = f"{name}-{i}"
        env = pod_env(container, i, hostname, secret, "0")
        argv = [*container["command"], *container.get("args", [])]
        pods.append(Node(host, hostname, k8s_hosts_text(name, name, ns, hosts, i), argv, env,
                         container.get("workingDir", "/"), pod / "scratch", mounts))  # fmt: skip
    try:
        codes = first_failure_teardown(pods, lambda n: os.kill(n.proc.pid, signal.SIGTERM), grace)
    finally:
        for p in pods:
            p.end()
    failed = any(codes)
    logs = {i: (c, "".join(f"{line}\n" for line in p.lines)) for i, (c, p) in
            enumerate(zip(codes, pods, strict=True))}  # fmt: skip
    if failed:
        return "Failed", "FailedIndexes", logs
    return "Complete", None, logs
