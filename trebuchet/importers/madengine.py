"""`treb import madengine`: a model card from a models.json (chosen with --tags) -> spec.

madengine runs the card's script once per machine in a conda prefix and lets it start its
own launcher: launcher `none`, the dependency recipe as `environment`. What its scripts
read is kept: MAD_RUNTIME_NGPUS (TREB_NGPUS where the engine sets it, else n_gpus), and
`multiple_results` as `results.file`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.importers.common import ImportResult, to_name
from trebuchet.importers.yamlsrc import locator, read_located

USED = {
    "name", "tags", "scripts", "n_gpus", "conda_env", "python_version", "requirements_file",
    "setup_script", "environment_file", "distributed", "timeout", "args", "multiple_results",
}  # fmt: skip
# The resolved GPU count, as madengine exports it to the model script (seed 000): the
# node's count where trebuchet sets TREB_NGPUS (the local engine: the mask's devices, or
# every detected one with n_gpus -1), else the card's count.
NGPUS = 'MAD_RUNTIME_NGPUS="${{MAD_RUNTIME_NGPUS:-${{TREB_NGPUS:-{n}}}}}"'


def _cards(data: Any) -> list[tuple[tuple, dict]]:
    if isinstance(data, dict) and "name" in data:
        return [((), data)]
    if isinstance(data, dict) and isinstance(data.get("models"), list):
        return [(("models", i), c) for i, c in enumerate(data["models"]) if isinstance(c, dict)]
    if isinstance(data, list):
        return [((i,), c) for i, c in enumerate(data) if isinstance(c, dict)]
    return []


def _matches(card: dict, tags: list[str]) -> bool:
    if not tags:
        return True
    have = card.get("tags") or []
    have = [str(t) for t in have] if isinstance(have, list) else [str(have)]
    return any(t == card.get("name") or t in have for t in tags)


def import_file(path: str | Path, tags: list[str] | None = None, **_: object) -> ImportResult:
    p = Path(path)
    loc = read_located(p)
    cards = _cards(loc.data)
    if not cards:
        raise UserError(f"{p}: no model card found (a list of cards, or one card with a name)")
    chosen = [(k, c) for k, c in cards if _matches(c, tags or [])]
    if not chosen:
        raise UserError(
            f"{p}: no card matches --tags {','.join(tags or [])} "
            f"(cards: {', '.join(str(c.get('name')) for _, c in cards)})"
        )
    if len(chosen) > 1:
        raise UserError(
            f"{p}: {len(chosen)} cards match"
            f"{' --tags ' + ','.join(tags) if tags else ''}: "
            f"{', '.join(str(c.get('name')) for _, c in chosen)}; "
            "pick one with --tags NAME"
        )
    base, card = chosen[0]
    res = ImportResult("madengine", str(p))
    spec = res.spec
    at = locator(loc, *base)
    root = p.resolve().parent  # madengine resolves card paths from the MAD repository root
    name = str(card.get("name") or p.stem)
    spec["name"] = to_name(name)
    if spec["name"] != name:
        res.note(at("name"), f"name {name!r}: run name {spec['name']!r}")
    script = card.get("scripts")
    if not isinstance(script, str) or not script.strip():
        raise UserError(f"{p}:{at()}: card {name}: scripts: must name the script to run")
    runner = "python" if script.endswith(".py") else "bash"
    command = [runner, script]
    args = card.get("args")
    extra = f" {args}" if isinstance(args, str) and args.strip() else ""
    if isinstance(args, list):
        extra = " " + shlex.join(str(a) for a in args)
    spec["workdir"] = str(root)
    spec["launcher"] = "none"
    n_gpus = card.get("n_gpus")
    count = "0"  # no n_gpus: gpus_per_node stays 0
    if n_gpus is not None:
        try:
            n = int(str(n_gpus))
        except ValueError:
            res.drop(at("n_gpus"), f"n_gpus: {n_gpus}", "not a number")
        else:
            spec["gpus_per_node"] = n if n >= 0 else -1
            count = str(n) if n >= 0 else "0"
            res.note(
                at("n_gpus"),
                f"n_gpus {n_gpus}: gpus_per_node {spec['gpus_per_node']}; the command sets "
                "MAD_RUNTIME_NGPUS to the resolved count ("
                + ("every visible GPU: TREB_NGPUS" if n < 0 else f"TREB_NGPUS, else {n}")
                + ")",
            )
    spec["command"] = NGPUS.format(n=count) + " " + shlex.join(command) + extra
    dist = card.get("distributed")
    if isinstance(dist, dict):
        for k, v in dist.items():
            if k == "nnodes":
                if re.fullmatch(r"[0-9]{1,6}", str(v).strip()) and not isinstance(v, bool):
                    spec["nodes"] = int(str(v).strip())
                else:
                    res.drop(at("distributed", k), f"distributed.nnodes: {v}", "not a number")
            elif k == "launcher":
                res.note(
                    at("distributed", k),
                    f"distributed.launcher {v}: the script starts it itself (launcher none)",
                )
            else:
                res.drop(at("distributed", k), f"distributed.{k}", "no spec field for it")

    def file(key: str) -> str | None:
        value = card.get(key)
        if not value:
            return None
        f = root / str(value)
        if not f.is_file():
            res.drop(at(key), f"{key}: {value}", f"{f} does not exist")
            return None
        return str(f)

    env: dict[str, Any] = {}
    if card.get("conda_env"):
        env["name"] = to_name(card["conda_env"])
    if req := file("requirements_file"):
        env["requirements"] = req
    if setup := file("setup_script"):
        env["setup"] = setup
    conda: dict[str, Any] = {}
    if envfile := file("environment_file"):
        conda["environment_file"] = envfile
    if card.get("python_version"):
        conda["python"] = str(card["python_version"])
    if conda or card.get("conda_env"):
        env["conda"] = conda
    if env:
        spec["environment"] = env
        if "conda_env" in card:
            res.note(
                at("conda_env"),
                f"conda_env {card['conda_env']}: environment.name "
                f"{env.get('name')} (a conda prefix built by trebuchet)",
            )
    timeout = card.get("timeout")
    if timeout is not None:
        try:
            seconds = float(timeout)
        except (TypeError, ValueError):
            res.drop(at("timeout"), f"timeout: {timeout}", "not a number of seconds")
        else:
            if seconds > 0:
                spec["timeout"] = int(seconds) if seconds.is_integer() else seconds
    multiple = card.get("multiple_results")
    if isinstance(multiple, str) and multiple.strip():
        spec["results"] = {"file": multiple}
        res.note(
            at("multiple_results"),
            f"multiple_results {multiple}: results.file (its rows become results, as in "
            "madengine; looked for in the run directory and where the script ran)",
        )
    elif multiple:
        res.drop(at("multiple_results"), f"multiple_results: {multiple}", "not a file name")
    res.drop_unknown(card, USED, at)
    return res
