"""The environment build on engines whose nodes start bare (SkyPilot, Kubernetes).

Why: those engines give a node nothing of the submitting host, so the spec's `environment`
is built on the node itself from files shipped with the code, by the same shell lines
(SkyPilot's `setup:` section, the start of a pod's command), run in the workdir.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trebuchet.spec.load import LoadedSpec

ENV_ROOT = ".trebuchet/envs"  # under the node's $HOME


def builds(loaded: LoadedSpec) -> bool:
    """The spec's environment has something to build on the node (not an image)."""
    env = loaded.spec.environment
    return bool(env and (env.requirements or env.setup or env.conda or env.python))


def env_files(loaded: LoadedSpec) -> list[tuple[tuple[str, ...], Path]]:
    """(field, path) of each file the environment is built from."""
    from trebuchet.spec.load import input_files

    base = loaded.path.parent if loaded.path else Path.cwd()
    return [(field, base / value) for field, value in input_files(loaded.spec)]


def inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def source_workdir(loaded: LoadedSpec) -> Path:
    """The workdir as the spec names it: where its environment's files are. Once `treb run`
    took the code snapshot, `loaded.workdir` is the copy, which keeps their places in it."""
    return loaded.origin or loaded.workdir


def check_files(loaded: LoadedSpec, engine: str, ships: str) -> None:
    """The environment's files must travel with the code (`ships`: what the engine ships)."""
    root = source_workdir(loaded)
    for field, path in env_files(loaded):
        if not inside(path, root):
            raise loaded.refusal(
                ".".join(field),
                f"{path} is outside workdir {root}: {engine} only ships {ships}",
            )


def _rel(loaded: LoadedSpec, value: str) -> str:
    """A file of the environment, relative to workdir (where the build runs)."""
    base = loaded.path.parent if loaded.path else Path.cwd()
    return os.path.relpath((base / value).resolve(), source_workdir(loaded).resolve())


def setup_lines(loaded: LoadedSpec) -> tuple[list[str], list[str]]:
    """The lines that build the environment, and those that enter it before the node agent
    starts."""
    if not builds(loaded):
        return [], []
    env = loaded.spec.environment
    assert env is not None
    q = shlex.quote
    name = q(env.name or loaded.spec.name)
    enter = f'TREB_ENV="$HOME/{ENV_ROOT}/"{name}'
    lines = ["set -e", enter]
    if env.conda:
        conda = q(env.conda.conda_bin or "conda")
        if env.conda.environment_file:
            lines.append(
                f'{conda} env create -y -p "$TREB_ENV" -f '
                f"{q(_rel(loaded, env.conda.environment_file))}"
            )
        else:
            py = env.conda.python or env.python
            lines.append(f'{conda} create -y -p "$TREB_ENV"' + (f" python={q(py)}" if py else ""))
    elif env.python:
        lines.append("python3 -m pip install -q uv")
        lines.append(f'python3 -m uv venv --seed --python {q(env.python)} "$TREB_ENV"')
    else:
        lines.append('python3 -m venv "$TREB_ENV"')
    path = 'export PATH="$TREB_ENV/bin:$PATH"'
    lines.append(path)
    if isinstance(env.requirements, str):
        lines.append(f"python -m pip install -r {q(_rel(loaded, env.requirements))}")
    elif env.requirements:
        lines.append("python -m pip install " + " ".join(q(r) for r in env.requirements))
    if env.setup:
        lines.append(f"bash {q(_rel(loaded, env.setup))}")
    return lines, [enter, path]
