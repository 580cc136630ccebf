"""`treb import air`: a Databricks AI Runtime workload YAML -> spec.

AI Runtime runs `command` once per node with NUM_NODES, NODE_RANK, MASTER_ADDR,
MASTER_PORT and LOCAL_WORLD_SIZE set: exactly trebuchet's launcher `none`.
compute.num_accelerators over accelerator_type (GPU_8xH100: 8 per node) gives the nodes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.importers.common import ImportResult, env_or_secret, to_name
from trebuchet.importers.yamlsrc import locator, read_mapping

ACCEL = re.compile(r"GPU_(\d+)x([A-Za-z0-9_-]+)", re.IGNORECASE)


def import_file(path: str | Path, **_: object) -> ImportResult:
    p, loc, data = read_mapping(path, "an AI Runtime workload")
    res = ImportResult("air", str(p))
    spec = res.spec
    at = locator(loc)
    for key, value in data.items():
        if key == "experiment_name":
            spec["name"] = to_name(value)
            if spec["name"] != value:
                res.note(at(key), f"experiment_name {value!r}: run name {spec['name']!r}")
        elif key == "command":
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"{p}:{at(key)}: command: must be a non-empty string")
            spec["command"] = value.rstrip("\n")
        elif key == "compute":
            _compute(value, res, at, p)
        elif key == "environment":
            _environment(value, res, at)
        elif key == "code_source":
            _code_source(value, res, at, p)
        elif key == "timeout_minutes":
            spec["timeout"] = f"{value}m"
        elif key == "max_retries":
            spec["retries"] = value
        elif key == "env_variables" and isinstance(value, dict):
            for name, v in value.items():
                env_or_secret(res, str(name), v, at(key, name))
        elif key == "secrets":
            _secrets(value, res, at)
        else:
            res.drop(at(key), key, "no spec field for it")
    if "command" not in spec:
        raise UserError(f"{p}: no command")
    spec["launcher"] = "none"
    if "CODE_SOURCE_PATH" in spec["command"]:
        spec.setdefault("env", {})["CODE_SOURCE_PATH"] = "."
        res.note(at("command"), "CODE_SOURCE_PATH is set to . (the run starts in workdir)")
    spec.setdefault("name", to_name(p.stem))
    return res


def _compute(value: Any, res: ImportResult, at, p: Path) -> None:
    if not isinstance(value, dict):
        res.drop(at("compute"), "compute", "not a mapping")
        return
    total = value.get("num_accelerators")
    kind = value.get("accelerator_type")
    m = ACCEL.fullmatch(str(kind or ""))
    if kind is not None and not m:
        res.drop(
            at("compute", "accelerator_type"),
            f"accelerator_type: {kind}",
            "not of the form GPU_<N>x<TYPE>",
        )
    per_node = int(m.group(1)) if m else None
    if total is not None:
        if not isinstance(total, int) or total < 1:
            raise UserError(
                f"{p}:{at('compute', 'num_accelerators')}: num_accelerators: must "
                f"be a positive integer, got {total!r}"
            )
        if per_node:
            if total % per_node:
                raise UserError(
                    f"{p}:{at('compute', 'num_accelerators')}: num_accelerators {total} is not "
                    f"a multiple of {per_node} ({kind} has {per_node} GPUs per node)"
                )
            res.spec["nodes"] = total // per_node
            res.spec["gpus_per_node"] = per_node
        else:
            res.spec["gpus_per_node"] = total
    elif per_node:
        res.spec["gpus_per_node"] = per_node
    if m:
        res.spec["skypilot"] = {"accelerators": f"{m.group(2)}:{per_node}"}
        res.note(
            at("compute", "accelerator_type"),
            f"accelerator_type {kind}: skypilot.accelerators {m.group(2)}:{per_node} "
            "(the GPU model is kept there only)",
        )
    res.drop_unknown(value, ("num_accelerators", "accelerator_type"), at, "compute")


def _environment(value: Any, res: ImportResult, at) -> None:
    if not isinstance(value, dict):
        res.drop(at("environment"), "environment", "not a mapping")
        return
    for k, v in value.items():
        if k == "dependencies" and isinstance(v, list):
            res.spec.setdefault("environment", {})["requirements"] = [str(x) for x in v]
        elif k == "version":
            res.drop(
                at("environment", k),
                f"environment.version: {v}",
                "a Databricks-managed environment; the requirements are installed into "
                "a venv instead",
            )
        else:
            res.drop(at("environment", k), f"environment.{k}", "no spec field for it")


def _code_source(value: Any, res: ImportResult, at, p: Path) -> None:
    root = None
    if isinstance(value, dict):
        snap = value.get("snapshot")
        if isinstance(snap, dict):
            root = snap.get("root_path")
        res.drop_unknown(value, ("type", "snapshot"), at, "code_source")
        if isinstance(snap, dict):
            res.drop_unknown(snap, ("root_path",), at, "code_source", "snapshot")
    if root is None:
        res.drop(at("code_source"), "code_source", "only snapshot.root_path is understood")
        return
    d = (p.resolve().parent / str(root)).resolve()
    if d.is_dir():
        res.spec["workdir"] = str(d)
    else:
        res.drop(
            at("code_source", "snapshot", "root_path"),
            f"root_path: {root}",
            f"{d} is not a directory here",
        )


def _secrets(value: Any, res: ImportResult, at) -> None:
    names = value if isinstance(value, list) else list(value) if isinstance(value, dict) else []
    for item in names:
        name = item if isinstance(item, str) else None
        if isinstance(item, dict):
            name = item.get("name") or item.get("env") or item.get("key")
        if name and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
            res.add_secret(str(name))
            res.note(
                at("secrets"),
                f"secret {name}: taken from the shell you submit from "
                "(its Databricks secret scope is not carried)",
            )
        else:
            res.drop(at("secrets"), f"secrets entry {item!r}", "not an environment name")
