"""How a process runs inside an environment: PATH for a venv, `conda run -p` for a
prefix, `docker|podman run` for an image (values by name only: `-e NAME`)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

from trebuchet.envs.build import run_prefix
from trebuchet.envs.recipe import Recipe


def container_engine() -> str | None:
    return shutil.which("docker") or shutil.which("podman")


def engine_problem() -> str | None:
    """Why no container can run here, or None when an engine answers."""
    engine = container_engine()
    if not engine:
        return "no container engine: install docker or podman"
    try:
        res = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{engine} info failed: {exc}"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"{engine} is installed but its engine does not answer ({last})"
    return None


def wrap_argv(
    recipe: Recipe | None,
    argv: list[str],
    env_names: Iterable[str],
    mounts: Iterable[str],
    cwd: str,
    gpus: list[str] | None,
    name: str,
) -> list[str]:
    """The argv that runs `argv` inside the environment (venvs need only PATH)."""
    if recipe is None or recipe.kind == "venv":
        return argv
    if recipe.kind == "conda":
        return [*run_prefix(recipe), *argv]
    engine = container_engine() or "docker"
    out = [engine, "run", "--rm", "--init", "--name", name, "--network", "host", "--ipc", "host"]
    for m in [*mounts, *recipe.mounts]:
        out += ["-v", m]
    out += ["-w", cwd]
    for var in sorted(set(env_names)):
        out += ["-e", var]  # the value comes from the engine client's environment
    if gpus:
        out += ["--gpus", f"device={','.join(gpus)}"] if recipe.vendor == "nvidia" else [
            "--device", "/dev/kfd", "--device", "/dev/dri"]  # fmt: skip
    return [*out, str(recipe.image), *argv]
