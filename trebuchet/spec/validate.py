"""Validation of a spec's data against the spec models (pydantic), with every problem said
as `file:line: field: why`; and the cache entry of a validated spec (cache.py, frozen.py).
Imported only when the spec cache has no entry: pydantic and the models cost ~0.2 s."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from trebuchet.errors import SpecError
from trebuchet.spec.command import empty_expansion
from trebuchet.spec.expand import expand_tree
from trebuchet.spec.frozen import key as model_key
from trebuchet.spec.load import default_name
from trebuchet.spec.model import Spec, engine_blocks, not_expanded, spec_model
from trebuchet.spec.source import Located, shortened
from trebuchet.spec.source import dotted as _dotted

if TYPE_CHECKING:
    from trebuchet.spec.load import LoadedSpec


def validate(located: Located, p: Path | None, environ: Mapping[str, str]) -> Spec:
    """The spec model of `located.data` (expanded from `environ`); SpecError lists every
    problem, by line."""
    raw = located.data or {}
    secrets = raw.get("secrets")
    secret_names = (
        frozenset(s for s in secrets if isinstance(s, str))
        if isinstance(secrets, list)
        else frozenset()
    )
    model = spec_model()
    skip = _skip(model)
    raw, errors = expand_tree(raw, environ, secret_names, skip)
    errors += list(_bad_text(raw, ()))
    problems = [f"{located.where(p_)}: {_dotted(p_)}: {msg}" for p_, msg in errors]
    raw.setdefault("name", default_name(p))
    try:
        spec = model.model_validate(raw)
    except ValidationError as exc:
        problems += _problems(exc, located, raw, model)
    else:
        env = raw.get("env") if isinstance(raw.get("env"), dict) else None
        shell = [_at(raw, p_) for p_ in skip if p_ != ("command",)]
        why = empty_expansion(spec.command, env, environ, [str(t) for t in shell if t])
        if why:
            problems.append(f"{located.where(('command',))}: command: {why}")
    if problems:
        raise SpecError(sorted(problems, key=_line_key))
    return spec


def _at(data: Any, path: tuple) -> Any:
    """The value at a key path of plain data, None when absent."""
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def cache_entry(loaded: LoadedSpec) -> dict[str, Any] | None:
    """What the spec cache keeps of a validated spec, or None when its frozen view could
    differ from the models (a model from outside trebuchet, a value not plain JSON)."""
    from trebuchet.spec.resolved import template

    models: dict[str, tuple[str, list[str]]] = {}
    if not _walk(loaded.spec, (), models):
        return None
    data = loaded.spec.model_dump(mode="json")
    if data != loaded.spec.model_dump():
        return None
    located = loaded.located
    assert located is not None
    return {
        "data": data, "models": models, "source": located.source,
        "lines": [[list(k), v] for k, v in located.lines.items()],
        "origins": [[list(k), v] for k, v in located.origins.items()],
        "resolved": template(loaded),
    }  # fmt: skip


def _walk(model: BaseModel, path: tuple[Any, ...], out: dict[str, tuple[str, list[str]]]) -> bool:
    if not type(model).__module__.startswith("trebuchet."):
        return False
    out[model_key(path)] = (type(model).__name__, sorted(model.model_fields_set))
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
        for i, item in items:
            if isinstance(item, BaseModel):
                sub = (*path, name) if i is None else (*path, name, i)
                if not _walk(item, sub, out):
                    return False
            elif isinstance(item, dict) and any(isinstance(v, BaseModel) for v in item.values()):
                return False  # a mapping of models: not a shape frozen.py reads
    return True


@functools.cache
def _skip(model: type[Spec]) -> frozenset[tuple]:
    return frozenset(not_expanded(model))


def _line_key(problem: str) -> tuple[int, str]:
    m = re.match(r"[^:]*:(\d+):", problem)
    return (int(m.group(1)) if m else 1 << 30, problem)


def _bad_text(data: Any, path: tuple) -> Any:
    """(path, why) of each string no command line, environment or path can hold."""
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return
    for key, value in items:
        sub = (*path, key)
        why = _text_why(key) or _text_why(value)
        if why:
            yield sub, why
        else:
            yield from _bad_text(value, sub)


def _text_why(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    if "\0" in text:
        return "contains a NUL byte, which no command line, environment or path can hold"
    if _SURROGATE.search(text):
        return "is not valid Unicode text (a lone surrogate such as \\ud800)"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _field_path(loc: Sequence[Any], raw: Any, top: type[BaseModel]) -> tuple:
    """Trim pydantic's loc to the user's key path (drop union tags and validator names)."""
    path: list[Any] = []
    node = raw
    model: type[BaseModel] | None = top
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
            model = _sub_model(model, part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif model is not None and part in model.model_fields:
            path.append(part)  # a missing field
            break
        else:
            continue
    return tuple(path)


def _sub_model(model: type[BaseModel] | None, name: Any) -> type[BaseModel] | None:
    if model is None or name not in model.model_fields:
        return None
    ann = model.model_fields[name].annotation
    for cand in (ann, *getattr(ann, "__args__", ())):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def _field_info(path: tuple, top: type[BaseModel]) -> tuple[type[BaseModel] | None, Any]:
    model: type[BaseModel] | None = top
    info = None
    for part in path:
        if isinstance(part, int):
            continue  # a list item has its list's model
        if model is None or part not in model.model_fields:
            return model, info
        info = model.model_fields[part]
        model = _sub_model(model, part)
    return model, info


ITEM_ALLOWED = {
    "env": "a string, number or boolean",
    "secrets": "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
    "command": "a non-empty string",
}


def _allowed(path: tuple, top: type[BaseModel]) -> str | None:
    if len(path) == 2 and path[0] in ITEM_ALLOWED:
        return ITEM_ALLOWED[str(path[0])]
    _, info = _field_info(path, top)
    extra = getattr(info, "json_schema_extra", None)
    return extra.get("x-allowed") if isinstance(extra, dict) else None


def _problems(exc: ValidationError, located: Located, raw: dict, top: type[BaseModel]) -> list[str]:
    problems: list[str] = []
    seen: set[tuple] = set()
    for err in exc.errors():
        loc = err["loc"]
        etype = err["type"]
        path = _field_path(loc, raw, top)
        if etype == "extra_forbidden":
            path = _field_path(loc[:-1], raw, top) + (loc[-1],)
        if path in seen:
            continue
        seen.add(path)
        where = located.where(path)
        field = _dotted(path)
        if etype == "extra_forbidden":
            problems.append(f"{where}: {field}: unknown field{_suggest(path, top)}")
        elif etype == "missing":
            problems.append(f"{where}: {field}: required field is missing ({_allowed(path, top)})")
        elif etype == "value_error" and "@" in err["msg"]:
            field, _, msg = err["msg"].split("@", 1)[1].partition("|")
            problems.append(f"{located.where(tuple(field.split('.')))}: {field}: {msg}")
        elif len(path) == 2 and path[0] == "env" and loc[-1] == "[key]":
            problems.append(
                f"{where}: {field}: is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )
        else:
            what = _allowed(path, top) or err["msg"].lower()
            got = err.get("input")
            hint = ""
            if isinstance(got, (int, float)) and not isinstance(got, bool) and "string" in what:
                hint = " (YAML read a number: put the value in quotes)"
            detail = str(err["msg"]).removeprefix("Value error, ")
            if etype == "value_error" and not detail.startswith("bad ") and detail not in what:
                hint += f" ({detail})"
            shown = "a value not shown" if path and path[-1] == "secret" else shortened(repr(got))
            problems.append(f"{where}: {field}: must be {what}, got {shown}{hint}")
    return problems


# Names other launchers give a field (torchrun, sbatch, SkyPilot, Ray): the field they mean.
ALIASES = {
    "gpus": "gpus_per_node", "num_gpus": "gpus_per_node", "gpus_per_task": "gpus_per_node",
    "num_nodes": "nodes", "nnodes": "nodes", "nproc_per_node": "procs_per_node",
    "ntasks_per_node": "procs_per_node", "tasks_per_node": "procs_per_node",
    "time": "timeout", "time_limit": "timeout", "walltime": "timeout", "max_retries": "retries",
    "max_restarts": "retries", "envs": "env", "env_vars": "env", "environment_variables": "env",
    "cmd": "command", "run": "command", "script": "command", "working_dir": "workdir",
    "cwd": "workdir", "chdir": "workdir", "image_id": "image", "container": "image",
}  # fmt: skip


def close_field(key: str, fields: list[str]) -> str | None:
    """The field a mistyped or borrowed key most likely means: a known alias, a close
    spelling (difflib), or the one field whose words hold the key's (`gpus`: gpus_per_node)."""
    low = key.lower().replace("-", "_")
    if ALIASES.get(low) in fields:
        return ALIASES[low]
    words = set(low.split("_"))
    holding = [f for f in fields if words <= set(f.split("_"))]
    if len(holding) == 1:
        return holding[0]
    close = difflib.get_close_matches(low, fields, n=1, cutoff=0.6)
    if close:
        return close[0]
    held = [f for f in fields if set(f.split("_")) <= words]
    return held[0] if len(held) == 1 else None


def _suggest(path: tuple, top: type[BaseModel]) -> str:
    """A did-you-mean hint, including keys that belong in an engine block."""
    parent_model, _ = _field_info(path[:-1], top) if len(path) > 1 else (top, None)
    if parent_model is None:
        return ""
    key = str(path[-1])
    close = close_field(key, list(parent_model.model_fields))
    if close:
        return f"; did you mean '{close}'?"
    if parent_model is top:
        for block in engine_blocks(top):
            sub = _sub_model(top, block)
            if sub and key in sub.model_fields:
                return f"; did you mean '{block}.{key}'? (engine settings go in their block)"
    fields = ", ".join(parent_model.model_fields)
    return f" (allowed: {fields})"
