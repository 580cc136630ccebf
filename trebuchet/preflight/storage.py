"""Where files live: node-local paths in multi-node runs, inputs missing on this host.

Seed 004's pitfall: NEMO_HOME left at /root/.cache/nemo, so the packed data that node 0
prepared is invisible to the other nodes ("TypeError: 'NoneType' object is not an iterator").
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import ERROR, WARNING, Finding

# Why a node-local value hurts, for the variables whose meaning is known.
CACHE_VARS = {
    "NEMO_HOME": "data that one node prepares (packed sequences) is invisible to the others",
    "HF_HOME": "each node downloads models and datasets again, and files one rank "
    "prepares are missing on the other nodes",
    "TRANSFORMERS_CACHE": "each node downloads the models again",
    "HF_HUB_CACHE": "each node downloads the models again",
    "HF_DATASETS_CACHE": "datasets one rank prepares are missing on the other nodes",
    "TORCH_HOME": "each node downloads hub checkpoints again",
    "UV_CACHE_DIR": "each node builds every wheel again (seed 004 warms one shared cache once)",
    "PIP_CACHE_DIR": "each node downloads and builds every package again",
    "XDG_CACHE_HOME": "every cache below it is per node",
}
# Per-node by design: scratch space, compile caches (a shared one only adds lock contention),
# sockets and per-node debug files. Never reported.
LOCAL_BY_DESIGN = {
    "TMPDIR", "TMP", "TEMP", "TEMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
    "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "XDG_RUNTIME_DIR", "NCCL_DEBUG_FILE",
    "NCCL_TOPO_DUMP_FILE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
}  # fmt: skip
LOCAL_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
HOME_MARKERS = ("~", "$HOME", "${HOME}")


def under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _mount_map(ctx: Context) -> list[tuple[str, str]]:
    """(container destination, host source) of each bind mount."""
    env = ctx.spec.environment
    out = []
    for m in env.mounts if env else []:
        src, _, rest = m.partition(":")
        dst = rest.split(":", 1)[0]
        if dst.startswith("/"):
            out.append((posixpath.normpath(dst), src))
    return out


def locality(
    value: str, home: str, mounts: list[tuple[str, str]] | None, cache: bool
) -> str | None:
    """How the path `value` is node-local: '' (a local disk), 'home' (only when the home is
    not shared), 'container' (inside each node's own container), or None (it is not).
    `mounts` is None for a host path, else the (destination, source) mounts of the container
    the path is seen from; `cache` says the variable is a known cache (see CACHE_VARS)."""
    for marker in HOME_MARKERS:
        if value == marker or value.startswith(marker + "/"):
            value = (home if mounts is None else "/root") + value[len(marker) :]
            break
    if not value.startswith("/"):
        return None
    path = posixpath.normpath(value)
    if mounts is not None:
        for dst, src in mounts:
            if under(path, dst):
                return locality(src + path[len(dst) :], home, None, cache)
        local = under(path, "/root") or any(under(path, r) for r in LOCAL_ROOTS)
        return "container" if local or cache else None
    if any(under(path, r) for r in LOCAL_ROOTS):
        return ""
    if under(path, posixpath.join(home, ".cache")):
        return "home"
    if under(path, "/root/.cache"):
        return ""
    return None


def _paths(value: str) -> list[str]:
    """The paths in a value: itself, or each part of a PATH-like list."""
    parts = value.split(":")
    if len(parts) > 1 and all(p.startswith(("/", "~", "$HOME", "${HOME}")) for p in parts if p):
        return [p for p in parts if p]
    return [value]


def node_local_cache(ctx: Context) -> list[Finding]:
    if not ctx.multi_node:
        return []
    home = ctx.environ.get("HOME") or os.path.expanduser("~")
    image = ctx.spec.environment is not None and bool(ctx.spec.environment.image)
    mounts = _mount_map(ctx) if image else None
    out = []
    values = [(name, value, False) for name, value in ctx.spec.env.items()]
    values += [
        (name, ctx.environ[name], True)
        for name in CACHE_VARS
        if name not in ctx.spec.env and ctx.environ.get(name) and not image
    ]
    for name, value, inherited in values:
        if name in LOCAL_BY_DESIGN or name in ctx.spec.secrets:
            continue
        for path in _paths(value):
            kind = locality(path, home, mounts, name in CACHE_VARS)
            if kind is None:
                continue
            why = CACHE_VARS.get(name, "files written on one node are invisible to the others")
            place = {
                "": "a node-local path",
                "home": "under your home's .cache (node-local unless your home is shared)",
                "container": "inside the container (each node has its own copy)",
            }[kind]
            src = " (inherited from this shell)" if inherited else ""
            out.append(
                ctx.finding(
                    "node-local-cache",
                    WARNING,
                    f"{name}={path}{src} is {place} in a {ctx.spec.nodes}-node run: {why}",
                    f"point {name} at a folder on the shared filesystem (e.g. "
                    f"{name}=<shared fs>/cache/{name.lower()})"
                    + (", or mount a shared folder there" if kind == "container" else ""),
                    *(("env",) if inherited else ("env", name)),
                )
            )
            break
    return out


def node_local_workdir(ctx: Context) -> list[Finding]:
    """snapshot: false runs in place, so the compute nodes must see the workdir itself."""
    if not ctx.remote or getattr(ctx.spec, "snapshot", True):
        return []
    home = ctx.environ.get("HOME") or os.path.expanduser("~")
    path = str(ctx.loaded.workdir)
    if not any(under(path, r) for r in LOCAL_ROOTS) and not under(
        path, posixpath.join(home, ".cache")
    ):
        return []
    return [
        ctx.finding(
            "node-local-workdir",
            WARNING,
            f"workdir {path} is on this host's local disk and snapshot is false: the compute "
            f"nodes run in place, from their own {path}, which does not hold your code",
            "move the code to the shared filesystem, or drop `snapshot: false` so the run "
            "executes a copy in the run directory",
            "workdir",
        )
    ]


def host_inputs(ctx: Context) -> list[Finding]:
    """What must exist on the submitting host before anything is queued."""
    out = []
    if not ctx.loaded.workdir.is_dir():
        out.append(
            ctx.finding(
                "workdir-missing",
                ERROR,
                f"workdir {ctx.loaded.workdir} does not exist on this host",
                "fix the workdir path (it is relative to the spec file)",
                "workdir",
            )
        )
    env = ctx.spec.environment
    for i, mount in enumerate(env.mounts if env else []):
        src = mount.split(":", 1)[0]
        if not src.startswith(("/", "~")):
            continue  # a named volume, or relative to wherever the engine runs
        host = Path(os.path.expanduser(src))
        if not host.exists():
            out.append(
                ctx.finding(
                    "mount-missing",
                    ERROR,
                    f"mount source {src} does not exist on this host: the container "
                    "would fail to start on every node (docker silently creates an empty "
                    "folder instead)",
                    f"create {src} or fix the path in environment.mounts (silence this "
                    "with `ignore_checks: [mount-missing]` if it exists only on the "
                    "compute nodes)",
                    "environment",
                    "mounts",
                    i,
                )
            )
    for i, name in enumerate(ctx.spec.secrets):
        if name not in ctx.environ:
            out.append(
                ctx.finding(
                    "secret-unset",
                    ERROR,
                    f"secrets: {name} not set in this shell (secrets are read from the "
                    "submitting environment at launch, and never stored)",
                    f"export {name}=... before running, or remove it from secrets",
                    "secrets",
                    i,
                )
            )
    return out
