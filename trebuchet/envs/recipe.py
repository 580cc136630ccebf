"""What an environment is made from, resolved once at submission into plain JSON.

The recipe names the prefix under TREB_HOME/envs, the input files (vendor variants
chosen), the tool, and the stamp that decides whether a built env can be reused.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from trebuchet.plain import asdict, field, record
from trebuchet.store.paths import treb_home

CONDA_SEARCH = ("micromamba", "mamba", "conda")


@record
class Recipe:
    kind: str  # venv | conda | image
    name: str
    prefix: str
    python: str | None = None
    requirements_file: str | None = None
    requirements: list[str] = field(default_factory=list)
    setup: str | None = None
    environment_file: str | None = None
    conda_bin: str | None = None
    image: str | None = None
    mounts: list[str] = field(default_factory=list)
    reuse: bool = True
    cleanup: bool = False
    vendor: str = "none"
    tool: str = ""
    stamp: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recipe:
        return cls(**data)


def safe_name(name: str) -> str:
    """One path segment: slashes, '..' and spaces cannot leave the envs folder."""
    flat = re.sub(r"[^A-Za-z0-9._-]+", "_", name.replace("/", "_")).strip("._-")
    flat = re.sub(r"\.{2,}", "_", flat)
    return (flat or "env")[:80]


def vendor_file(path: Path, vendor: str) -> Path:
    """requirements.txt -> requirements.nvidia.txt on NVIDIA when that file exists."""
    if vendor in ("nvidia", "amd"):
        variant = path.with_name(f"{path.stem}.{vendor}{path.suffix}")
        if variant.is_file():
            return variant
    return path


def find_uv() -> str | None:
    """The uv executable: the PyPI package's own binary, else one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def find_conda(conda_bin: str | None) -> str | None:
    if conda_bin:
        return shutil.which(conda_bin) or (conda_bin if Path(conda_bin).is_file() else None)
    return next(filter(None, map(shutil.which, CONDA_SEARCH)), None)


def recipe_for(spec: Any, base: Path, vendor: str) -> Recipe | None:
    """The recipe of a spec's `environment:` (None: run in the current environment).
    Local and Slurm runs build it; `bare_nodes_only` leaves it to SkyPilot and Kubernetes
    nodes (backends/node_setup.py), whose callers never come here."""
    env = spec.environment
    if env is None or env.bare_nodes_only:
        return None
    name = safe_name(env.name or spec.name)
    r = Recipe(kind=env.kind, name=name, prefix=str(treb_home() / "envs" / name),
               reuse=env.reuse, cleanup=env.cleanup, vendor=vendor)  # fmt: skip
    if env.kind == "image":
        r.image, r.mounts = env.image, list(env.mounts)
        return r

    def variant(rel: str) -> str:
        return str(vendor_file((base / rel).resolve(), vendor))

    if isinstance(env.requirements, str):
        r.requirements_file = variant(env.requirements)
    elif env.requirements:
        r.requirements = list(env.requirements)
    if env.setup:
        r.setup = variant(env.setup)
    if env.kind == "conda":
        r.python = env.conda.python
        if env.conda.environment_file:
            r.environment_file = variant(env.conda.environment_file)
        r.conda_bin = find_conda(env.conda.conda_bin)
        r.tool = Path(r.conda_bin).name if r.conda_bin else "conda"
    else:
        r.python = env.python
        r.tool = "uv" if find_uv() else "pip"
    r.stamp = stamp(r)
    return r


def stamp(r: Recipe) -> str:
    """Hash of everything the env is built from; a changed input means a rebuild."""
    import hashlib  # here: a run without an environment never needs it

    h = hashlib.sha256()
    for part in (r.kind, r.python or "", r.tool, "\n".join(r.requirements)):
        h.update(part.encode() + b"\0")
    for path in (r.requirements_file, r.environment_file, r.setup):
        h.update((path or "").encode() + b"\0")
        if path:
            h.update(Path(path).read_bytes() + b"\0")
    return h.hexdigest()[:16]
