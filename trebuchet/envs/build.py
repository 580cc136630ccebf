"""Build or reuse an environment under a lock; write a manifest only when it is complete.

A manifest (`treb-env.json` in the prefix) with the recipe's stamp means "built and
usable"; anything else is rebuilt from scratch, so a half-built env is never reused.
Imports no pydantic: the detached supervisor calls this.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from trebuchet.envs.recipe import Recipe, find_uv
from trebuchet.store.files import write_json

MANIFEST = "treb-env.json"


class BuildError(RuntimeError):
    """A build step failed; the message says which and where its output is."""


@contextmanager
def locked(prefix: Path) -> Iterator[None]:
    """One builder per env at a time (two runs of one workload wait for each other)."""
    prefix.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(prefix.parent / f".{prefix.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def manifest(prefix: Path) -> dict[str, Any] | None:
    try:
        return json.loads((prefix / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def ensure(recipe: Recipe, log: IO[str]) -> dict[str, Any]:
    """The env's manifest, building it first unless an identical one exists."""
    t0 = time.perf_counter()
    if recipe.kind == "image":
        return {"kind": "image", "image": recipe.image, "reused": True, "build_seconds": 0.0}
    prefix = Path(recipe.prefix)
    with locked(prefix):
        old = manifest(prefix)
        if recipe.reuse and old and old.get("stamp") == recipe.stamp and _usable(recipe):
            return {**old, "reused": True, "check_seconds": time.perf_counter() - t0}
        if prefix.exists():
            shutil.rmtree(prefix)
        try:
            (_build_conda if recipe.kind == "conda" else _build_venv)(recipe, prefix, log)
        except BaseException:
            shutil.rmtree(prefix, ignore_errors=True)
            raise
        seconds = time.perf_counter() - t0
        inputs = ("requirements_file", "requirements", "setup", "environment_file")
        out = {"name": recipe.name, "kind": recipe.kind, "prefix": str(prefix),
               "stamp": recipe.stamp, "tool": recipe.tool, "python": recipe.python,
               "built_at": time.time(), "build_seconds": seconds,
               "inputs": {k: getattr(recipe, k) for k in inputs}}  # fmt: skip
        write_json(prefix / MANIFEST, out)
        return {**out, "reused": False}


def remove(recipe: Recipe) -> None:
    """cleanup: true: the env goes when the run ends."""
    if recipe.kind != "image":
        prefix = Path(recipe.prefix)
        with locked(prefix):
            shutil.rmtree(prefix, ignore_errors=True)


def _usable(recipe: Recipe) -> bool:
    return (Path(recipe.prefix) / "bin" / "python").exists()


def _step(argv: list[str], log: IO[str], what: str, env: dict[str, str] | None = None) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    res = subprocess.run(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
    )
    if res.returncode != 0:
        where = getattr(log, "name", "the build log")
        raise BuildError(f"{what} failed (exit {res.returncode}); see {where}")


def _build_venv(r: Recipe, prefix: Path, log: IO[str]) -> None:
    uv = find_uv() if r.tool == "uv" else None
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    if uv:
        _step(
            [uv, "venv", "--python", r.python or sys.executable, str(prefix)], log, "uv venv", env
        )
        pip = [uv, "pip", "install", "--python", str(prefix / "bin" / "python")]
    else:
        python = python_executable(r.python) or sys.executable
        _step([python, "-m", "venv", str(prefix)], log, "python -m venv")
        venv_python = str(prefix / "bin" / "python")
        pip = [venv_python, "-m", "pip", "install", "--disable-pip-version-check"]
    if r.requirements_file:
        _step([*pip, "-r", r.requirements_file], log, "installing requirements", env)
    if r.requirements:
        _step([*pip, *r.requirements], log, "installing requirements", env)
    if r.setup:
        path = f"{prefix}/bin:{os.environ.get('PATH', '')}"
        act = {**os.environ, "VIRTUAL_ENV": str(prefix), "PATH": path}
        _step(["bash", r.setup], log, f"setup script {r.setup}", act)


def conda_commands(r: Recipe, prefix: Path) -> list[list[str]]:
    """The commands that create a conda prefix (micromamba, mamba or conda)."""
    exe = r.conda_bin or "conda"
    cmds = []
    if r.environment_file:
        create = [exe, "env", "create"] if Path(exe).name == "conda" else [exe, "create"]
        cmds.append([*create, "--yes", "-p", str(prefix), "-f", r.environment_file])
    else:
        cmds.append([exe, "create", "--yes", "-p", str(prefix), f"python={r.python}", "pip"])
    run = run_prefix(r)
    if r.requirements_file:
        cmds.append([*run, "python", "-m", "pip", "install", "-r", r.requirements_file])
    if r.requirements:
        cmds.append([*run, "python", "-m", "pip", "install", *r.requirements])
    if r.setup:
        cmds.append([*run, "bash", r.setup])
    return cmds


def run_prefix(r: Recipe) -> list[str]:
    """How a command runs inside a conda prefix; conda and mamba would swallow the output
    without --no-capture-output (micromamba streams by default)."""
    exe = r.conda_bin or "conda"
    argv = [exe, "run", "-p", r.prefix]
    if Path(exe).name in ("conda", "mamba"):
        argv.append("--no-capture-output")
    return argv


def _build_conda(r: Recipe, prefix: Path, log: IO[str]) -> None:
    if not r.conda_bin:
        raise BuildError("no conda executable (micromamba, mamba or conda) was found on PATH")
    for argv in conda_commands(r, prefix):
        _step(argv, log, f"{Path(argv[0]).name} {argv[1]}")


def python_executable(version: str | None) -> str | None:
    """An installed interpreter of `version` ("3.11"), without downloading one."""
    if not version:
        return sys.executable
    uv = find_uv()
    if uv:
        res = subprocess.run([uv, "python", "find", "--no-python-downloads", version],
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode == 0 and res.stdout.strip():
            return res.stdout.strip()
    return shutil.which(f"python{version}")


def missing_tool(recipe: Recipe) -> tuple[tuple[str, ...], str] | None:
    """(field, why) when this host lacks what building the env needs; None when it has it."""
    if recipe.kind == "conda" and not recipe.conda_bin:
        return ("environment", "conda"), (
            "no micromamba, mamba or conda on PATH (install one, or set "
            "environment.conda.conda_bin)"
        )
    if recipe.kind == "venv" and not python_executable(recipe.python):
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        return ("environment", "python"), (
            f"Python {recipe.python} is not installed here; install it (your OS packages, "
            f"pyenv, or `uv python install {recipe.python}` where the network allows) or use {here}"
        )
    return None
