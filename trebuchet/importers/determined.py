"""`treb import determined`: the launch part of a Determined experiment config -> spec.

Determined starts a trial through the launch layer named in `entrypoint`
(`python3 -m determined.launch.horovod -- CMD`). What carries over: the command after it,
the launcher (horovod, or torchrun for torch_distributed), slots_per_trial as the ranks,
native_parallel as launcher none, max_restarts as retries, the fusion optimizations as
Horovod's variables, the environment's variables and image. The rest (searcher, Trial API,
checkpoint storage...) is Determined's own and named as not carried over.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.importers.common import ImportResult, env_or_secret, to_name
from trebuchet.importers.yamlsrc import locator, read_mapping

LAUNCH = {
    "determined.launch.horovod": "horovod",
    "determined.launch.torch_distributed": "torchrun",
}
# optimizations that horovodrun takes as flags -> Horovod's own variables (same meaning)
FUSION = {
    "tensor_fusion_threshold": ("HOROVOD_FUSION_THRESHOLD", 1024 * 1024),  # MB -> bytes
    "tensor_fusion_cycle_time": ("HOROVOD_CYCLE_TIME", 1),  # ms
}
MAX_SLOTS = 65536


def import_file(path: str | Path, **_: object) -> ImportResult:
    p, loc, data = read_mapping(path, "a Determined experiment config")
    res = ImportResult("determined", str(p))
    spec = res.spec
    at = locator(loc)
    for key, value in data.items():
        if key == "name":
            spec["name"] = to_name(value)
        elif key == "entrypoint":
            _entrypoint(value, res, at(key), p)
        elif key == "resources":
            _resources(value, res, at, p)
        elif key == "max_restarts":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
                raise UserError(f"{p}:{at(key)}: max_restarts: must be a whole number 0-100")
            spec["retries"] = value
        elif key == "optimizations":
            _optimizations(value, res, at)
        elif key == "environment":
            _environment(value, res, at)
        else:
            res.drop(at(key), key, "Determined's own: no spec field for it")
    if "command" not in spec:
        raise UserError(f"{p}: no entrypoint")
    spec.setdefault("name", to_name(p.stem))
    return res


def _entrypoint(value: Any, res: ImportResult, line: int | None, p: Path) -> None:
    if isinstance(value, list):
        value = shlex.join(str(v) for v in value)
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{p}:{line}: entrypoint: must be a command")
    words = shlex.split(value)
    if len(words) >= 3 and words[1] == "-m" and words[2] in LAUNCH:
        layer = words[2]
        rest = words[3:]
        flags = []
        while rest and rest[0].startswith("--") and rest[0] != "--":
            flags.append(rest.pop(0))
        if rest and rest[0] == "--":
            rest = rest[1:]
        if "--trial" in flags or not rest:
            raise UserError(
                f"{p}:{line}: entrypoint: a Trial class ({value.strip()!r}) runs only inside "
                "Determined: give the training script (`... -- python3 train.py`)"
            )
        res.spec["launcher"] = LAUNCH[layer]
        res.spec["command"] = shlex.join(rest)
        res.note(line, f"entrypoint: {layer} -> launcher: {LAUNCH[layer]}")
        for flag in flags:
            res.drop(line, f"{layer} {flag}", "the launch layer's own option")
    else:
        res.spec["command"] = value.strip()
        res.note(line, "entrypoint without a launch layer: one process per slot (native)")


def _resources(value: Any, res: ImportResult, at, p: Path) -> None:
    if not isinstance(value, dict):
        res.drop(at("resources"), "resources", "not a mapping")
        return
    for key, v in value.items():
        line = at("resources", key)
        if key == "slots_per_trial":
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_SLOTS:
                raise UserError(f"{p}:{line}: slots_per_trial: must be a whole number "
                                f"1-{MAX_SLOTS}")  # fmt: skip
            res.spec["procs_per_node"] = v
            why = "Determined splits slots over its agents: set nodes, procs_per_node"
            res.note(line, f"slots_per_trial {v}: {v} ranks on one node ({why})")
        elif key == "native_parallel":
            if v is True:
                res.spec["launcher"] = "none"
                res.note(line, "native_parallel: the code starts its own ranks: launcher none")
        else:
            res.drop(line, f"resources.{key}", "Determined's scheduling: no spec field")


def _optimizations(value: Any, res: ImportResult, at) -> None:
    if not isinstance(value, dict):
        res.drop(at("optimizations"), "optimizations", "not a mapping")
        return
    env = res.spec.setdefault("env", {})
    for key, v in value.items():
        line = at("optimizations", key)
        if (
            key in FUSION
            and isinstance(v, (int, float))
            and not isinstance(v, bool)
            and 0 <= v < 1e15
        ):
            name, scale = FUSION[key]
            env[name] = str(int(v * scale))
            res.note(line, f"optimizations.{key}: {v} -> env.{name}")
        elif key == "auto_tune_tensor_fusion" and isinstance(v, bool):
            if v:
                env["HOROVOD_AUTOTUNE"] = "1"
                res.note(line, "optimizations.auto_tune_tensor_fusion -> env.HOROVOD_AUTOTUNE")
        else:
            res.drop(line, f"optimizations.{key}", "done by Determined's Trial API")


def _environment(value: Any, res: ImportResult, at) -> None:
    if not isinstance(value, dict):
        res.drop(at("environment"), "environment", "not a mapping")
        return
    for key, v in value.items():
        line = at("environment", key)
        if key == "environment_variables":
            entries = v
            if isinstance(v, dict):  # {cpu: [...], cuda: [...]}: the GPU one
                entries = v.get("cuda") or v.get("gpu") or v.get("cpu") or []
                res.note(line, "environment_variables per device type: the cuda ones")
            for entry in entries if isinstance(entries, list) else []:
                name, sep, val = str(entry).partition("=")
                if sep and name.strip():
                    env_or_secret(res, name.strip(), val, line)
                else:
                    res.drop(line, f"environment variable {entry!r}", "not NAME=VALUE")
        elif key == "image":
            image = v.get("cuda") or v.get("gpu") if isinstance(v, dict) else v
            if isinstance(image, str) and image:
                res.spec["environment"] = {"image": image}
            else:
                res.drop(line, "environment.image", "no image for one device type")
        else:
            res.drop(line, f"environment.{key}", "no spec field for it")
