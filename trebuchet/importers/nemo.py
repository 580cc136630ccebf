"""`treb import nemo`: a NeMo AutoModel config with a `slurm:` or `skypilot:` block -> spec.

AutoModel's job runs torchrun with ntasks_per_node processes per node on the recipe
module, reading the same config file; `${VAR}` / `${VAR,default}` in env_vars stay
references (`${VAR}` / `${VAR:-default}`), resolved when the run is submitted.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.importers.common import ImportResult, env_or_secret, to_name
from trebuchet.importers.yamlsrc import line_of, read_mapping

DEFAULT_RECIPE = "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction"
DEFAULT_REPO = "/opt/Automodel"
NEMO_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


def _ref(value: str) -> str:
    """NeMo's ${VAR,default} -> trebuchet's ${VAR:-default}; ${VAR} stays."""
    return NEMO_REF.sub(
        lambda m: "${" + m.group(1) + (f":-{m.group(2)}" if m.group(2) is not None else "") + "}",
        value,
    )


def _recipe(data: dict, override: str | None) -> tuple[str, bool]:
    if override:
        return override, True
    r = data.get("recipe")
    if isinstance(r, dict):
        r = r.get("_target_")
    return (str(r), True) if isinstance(r, str) and r else (DEFAULT_RECIPE, False)


def import_file(path: str | Path, recipe: str | None = None, **_: object) -> ImportResult:
    p, loc, data = read_mapping(path, "a NeMo AutoModel config")
    blocks = [k for k in ("slurm", "skypilot") if isinstance(data.get(k), dict)]
    if not blocks:
        raise UserError(f"{p}: no slurm: or skypilot: block (nothing says how to launch it)")
    res = ImportResult("nemo", str(p))
    for k in ("slurm", "skypilot"):
        if k in blocks:
            (_slurm if k == "slurm" else _skypilot)(data[k], res, loc)
    if len(blocks) > 1:
        res.note(
            line_of(loc, "skypilot"),
            "both slurm: and skypilot: blocks: the shape comes from slurm:",
        )
    spec = res.spec
    target, known = _recipe(data, recipe)
    repo = spec.pop("_repo", DEFAULT_REPO)
    module = target.rsplit(".", 1)[0]
    script = f"{repo}/{module.replace('.', '/')}.py"
    config = str(p.resolve())
    spec["command"] = (
        f"PYTHONPATH={shlex.quote(repo)}:${{PYTHONPATH:-}} python "
        f"{shlex.quote(script)} -c {shlex.quote(config)}"
    )
    if not known:
        res.note(
            line_of(loc, "recipe"),
            f"no recipe._target_ in the config: {target} (give another with --recipe)",
        )
    res.note(
        None,
        f"the command reads {config} as its recipe config, as AutoModel's job does: "
        "keep it where the nodes can read it",
    )
    spec["launcher"] = "torchrun"
    spec.setdefault("name", to_name(p.stem))
    return res


def _whole(value: Any, res: ImportResult, line: int | None, field: str) -> int:
    """A count or a port as written (2, "2", 2.0); anything else is named at its line."""
    text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    if isinstance(value, bool) or not re.fullmatch(r"[0-9]{1,9}", text.strip()):
        where = f"{res.source}:{line}" if line else res.source
        raise UserError(f"{where}: {field}: {value!r} is not a whole number")
    return int(text)


def _common(key: str, block: str, value: Any, res: ImportResult, loc) -> bool:
    spec, line = res.spec, line_of(loc, block, key)
    if key == "env_vars" and isinstance(value, dict):
        for name, v in value.items():
            text = _ref(str(v)) if v is not None else ""
            env_or_secret(res, str(name), text, line_of(loc, block, key, name))
    elif key == "master_port":
        spec["master_port"] = _whole(value, res, line, f"{block}.{key}")
    elif key == "hf_home":
        home = str(value)
        if home.startswith("~/"):
            home = "${HOME}/" + home[2:]
            res.note(line, f"hf_home {value}: HF_HOME={home} (expanded when you submit)")
        spec.setdefault("env", {})["HF_HOME"] = home
    elif key in ("container_image", "image"):
        spec.setdefault("environment", {})["image"] = str(value)
    elif key == "job_name":
        spec["name"] = to_name(value)
        if spec["name"] != value:
            res.note(line, f"job_name {value!r}: run name {spec['name']!r}")
    else:
        return False
    return True


def _slurm(block: dict, res: ImportResult, loc) -> None:
    spec = res.spec
    slurm = spec.setdefault("slurm", {})
    for key, value in block.items():
        line = line_of(loc, "slurm", key)
        if _common(key, "slurm", value, res, loc):
            continue
        if key == "nodes":
            spec["nodes"] = _whole(value, res, line, f"slurm.{key}")
        elif key == "ntasks_per_node":
            spec["procs_per_node"] = _whole(value, res, line, f"slurm.{key}")
        elif key == "gpus_per_node":
            spec["gpus_per_node"] = _whole(value, res, line, f"slurm.{key}")
        elif key in ("time", "account", "partition", "qos", "constraint"):
            slurm[key] = str(value)
        elif key == "exclusive":
            slurm["exclusive"] = bool(value)
        elif key == "extra_mounts" and isinstance(value, list):
            mounts = spec.setdefault("environment", {}).setdefault("mounts", [])
            for i, m in enumerate(value):
                if isinstance(m, dict) and "source" in m:
                    mounts.append(f"{m['source']}:{m.get('dest', m['source'])}")
                elif isinstance(m, str):
                    mounts.append(m if ":" in m else f"{m}:{m}")
                else:
                    res.drop(line_of(loc, "slurm", key, i), f"extra_mounts[{i}]", "not a mount")
        elif key == "nsys_enabled":
            if value:
                spec["profile"] = "nsys"
        elif key == "repo_root":
            spec["_repo"] = str(value)
        elif key == "job_dir":
            res.drop(line, f"slurm.job_dir: {value}", "trebuchet keeps runs under $TREB_HOME/runs")
        else:
            res.drop(line, f"slurm.{key}", "no spec field for it")
    if "procs_per_node" in spec and "gpus_per_node" not in spec:
        spec["gpus_per_node"] = spec["procs_per_node"]  # AutoModel: one task per GPU


def _skypilot(block: dict, res: ImportResult, loc) -> None:
    spec = res.spec
    sky = spec.setdefault("skypilot", {})
    have_slurm = "slurm" in spec and spec["slurm"]
    for key, value in block.items():
        line = line_of(loc, "skypilot", key)
        if _common(key, "skypilot", value, res, loc):
            continue
        if key in ("cloud", "region"):
            sky[key] = str(value)
        elif key == "use_spot":
            sky["use_spot"] = bool(value)
        elif key == "disk_size":
            sky["disk_size"] = _whole(value, res, line, f"skypilot.{key}")
        elif key == "accelerators":
            sky["accelerators"] = str(value)
            m = re.fullmatch(r"[^:]+:(\d+)", str(value))
            if m and not have_slurm:
                spec["gpus_per_node"] = int(m.group(1))
        elif key == "num_nodes":
            if not have_slurm:
                spec["nodes"] = _whole(value, res, line, f"skypilot.{key}")
        elif key == "setup":
            _setup(str(value), res, line)
        else:
            res.drop(line, f"skypilot.{key}", "no spec field for it")


def _setup(text: str, res: ImportResult, line: int | None) -> None:
    """`pip install a b` -> environment.requirements; anything else cannot be carried."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = []
    pkgs = None
    starts = (["pip", "install"], ["pip3", "install"], ["python", "-m", "pip", "install"],
              ["uv", "pip", "install"])  # fmt: skip
    for start in starts:
        if words[: len(start)] == start and all(not w.startswith("-") for w in words[len(start) :]):
            pkgs = words[len(start) :]
    if pkgs:
        res.spec.setdefault("environment", {})["requirements"] = pkgs
        res.note(line, f"skypilot.setup {text!r}: environment.requirements {pkgs}")
    else:
        res.drop(
            line,
            f"skypilot.setup: {text}",
            "only a plain `pip install PKG...` maps to environment.requirements",
        )
