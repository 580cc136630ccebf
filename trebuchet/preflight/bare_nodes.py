"""Engines whose nodes start bare (SkyPilot, Kubernetes): what the nodes would lack.

Such a node has nothing of the submitting host: without an environment or an image,
`python train.py` finds no torch there after the nodes were paid for, and a recovered job
starts on a fresh node without the node-local checkpoints. The engines call these from
their own `preflight`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from trebuchet.preflight.command import command_text, python_script, script_bytes, words
from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import WARNING, Finding

# Files that say the code needs packages installed.
DEPENDENCY_FILES = ("requirements.txt", "pyproject.toml", "setup.py", "environment.yml")


def third_party_imports(ws: list[str], workdir: Path) -> list[str]:
    """Modules outside the standard library that the command's Python script imports at
    its top level (imports inside a function or a `try` are optional: not counted), less
    those the workdir itself holds."""
    import ast  # here: only engines whose nodes start bare read the script

    script = python_script(ws)
    data = script_bytes(script, workdir) if script else None
    try:
        tree = ast.parse(data or b"")
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in tree.body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for name in names:
            top = name.partition(".")[0]
            local = (workdir / f"{top}.py").exists() or (workdir / top).is_dir()
            if top not in sys.stdlib_module_names and not local and top not in found:
                found.append(top)
    return found


def environment_missing(ctx: Context, engine: str, has_image: bool) -> list[Finding]:
    """`node-environment-missing`: nothing is built on the nodes, no image, and the code
    says it needs packages (a dependency file in the workdir, or third-party imports)."""
    env = ctx.spec.environment
    if has_image or (env and (env.requirements or env.setup or env.conda or env.python)):
        return []
    workdir = ctx.loaded.workdir
    needs = [f for f in DEPENDENCY_FILES if (workdir / f).is_file()]
    imports = third_party_imports(words(command_text(ctx.spec.command)), workdir)
    if not needs and not imports:
        return []
    what = " and ".join(
        part
        for part in (
            f"imports {', '.join(imports)}" if imports else "",
            f"the workdir has {', '.join(needs)}" if needs else "",
        )
        if part
    )
    req = "requirements.txt" if "requirements.txt" in needs else "[torch, ...]"
    return [
        ctx.finding(
            "node-environment-missing",
            WARNING,
            f"the {engine} nodes start bare and get no environment and no image, but the "
            f"command {what}: those packages are missing there",
            f"add `environment: {{requirements: {req}}}` (built on every node before the "
            "ranks start; `bare_nodes_only: true` keeps local and Slurm runs in the "
            "submitting environment), or an image that has them",
            "environment" if env else "command",
        )
    ]


def checkpoints_lost(ctx: Context, engine: str, how: str, field: str, *at: str) -> list[Finding]:
    """`checkpoints-node-local`: the engine recovers the job on a fresh node (`how`) and
    TREB_CHECKPOINT_DIR is on the node's own disk (no `field` mounted for it)."""
    if "TREB_CHECKPOINT_DIR" in ctx.spec.env:
        return []  # the spec points it somewhere itself
    return [
        ctx.finding(
            "checkpoints-node-local",
            WARNING,
            f"{how}, but TREB_CHECKPOINT_DIR is on the node's own disk: a recovered "
            f"{engine} job starts on a fresh node without the checkpoints of the attempt "
            "before, and trains from the start",
            f"set `{field}` (mounted where TREB_CHECKPOINT_DIR points)",
            *at,
        )
    ]
