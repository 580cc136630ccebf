"""Spec file -> validated Spec, with every problem reported as `file:line: field: why`."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trebuchet.errors import SpecError, UserError
from trebuchet.spec.expand import expand_tree
from trebuchet.spec.model import Spec, engine_blocks, not_expanded, spec_model
from trebuchet.spec.yamlsrc import MAX_DEPTH, Located, parse_yaml, read_spec, yaml_value
from trebuchet.spec.yamlsrc import dotted as _dotted


@dataclass
class LoadedSpec:
    """A validated spec and where it came from."""

    spec: Spec
    path: Path | None
    workdir: Path
    base: Path = Path(".")  # the spec file's folder: environment files are relative to it
    located: Located | None = None

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "<spec>"

    def where(self, *path: str) -> str:
        """`file:line` of a field, for errors found after validation (by a backend)."""
        return self.located.where(path) if self.located else self.source


def default_name(path: Path | None) -> str:
    """A valid run name from the file's stem ("My Job.yaml" -> "my-job")."""
    stem = path.stem if path else "job"
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return (name or "job")[:63]


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`key.sub=value` -> (("key", "sub"), value).

    The value stays the text typed (validation converts "2" to an integer where one is
    expected; env.LR=0.10 stays "0.10", name=0123 stays "0123"); only flow collections
    ([a, b], {k: v}), quoted strings and null are read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not p for p in key.strip().split(".")):
        raise UserError(f"-o {text}: expected key.sub=value")
    parsed: Any = value
    stripped = value.strip()
    if stripped[:1] in ("[", "{", '"', "'") or stripped in ("null", "~"):
        try:
            parsed = yaml_value(stripped)
        except ValueError as exc:
            raise UserError(f"-o {_short(text)}: the value is not valid: {exc}") from None
    return tuple(key.strip().split(".")), parsed


def apply_overrides(located: Located, overrides: Sequence[str]) -> None:
    """Set each override in the raw data, remembering it as the source of that field."""
    if located.data is None:
        located.data = {}
    for text in overrides:
        keys, value = parse_override(text)
        node = located.data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key) if isinstance(node, dict) else None
            if child is None:
                child = {}
                node[key] = child
            if not isinstance(child, dict):
                raise UserError(f"-o {text}: {'.'.join(keys[: depth + 1])} is not a mapping")
            node = child
        node[keys[-1]] = value
        for i in range(1, len(keys) + 1):
            located.origins[keys[:i]] = f"-o {text}"


def load_spec(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    text: str | None = None,
    data: dict | None = None,
) -> LoadedSpec:
    """Load, expand, override and validate a spec from a file, YAML text or a dict."""
    environ = os.environ if environ is None else environ
    p = Path(path) if path is not None else None
    source = str(p) if p else "<spec>"
    if data is not None:
        located = Located(_copy(data), {(): 1}, source)
    else:
        if text is None:
            if p is None:
                raise UserError("no spec given")
            text = read_spec(p)
        located = parse_yaml(text, source)
    if located.data is not None and not isinstance(located.data, dict):
        raise SpecError(
            [f"{source}:1: the spec must be a mapping of fields, got {_kind(located.data)}"]
        )
    apply_overrides(located, overrides)
    raw = located.data or {}
    secrets = raw.get("secrets")
    secret_names = (
        frozenset(s for s in secrets if isinstance(s, str))
        if isinstance(secrets, list)
        else frozenset()
    )
    model = spec_model()
    raw, errors = expand_tree(raw, environ, secret_names, _skip(model))
    errors += list(_bad_text(raw, ()))
    problems = [f"{located.where(p_)}: {_dotted(p_)}: {msg}" for p_, msg in errors]
    raw.setdefault("name", default_name(p))
    try:
        spec = model.model_validate(raw)
    except ValidationError as exc:
        problems += _problems(exc, located, raw, model)
    if problems:
        raise SpecError(sorted(problems, key=_line_key))
    base = p.resolve().parent if p else Path.cwd()
    try:
        workdir = (base / spec.workdir).resolve()
        is_dir = workdir.is_dir()
    except OSError as exc:  # a name longer than the system allows, a symlink loop
        raise SpecError([f"{located.where(('workdir',))}: workdir: {exc.strerror}"]) from None
    if not is_dir:
        raise SpecError([f"{located.where(('workdir',))}: workdir: {workdir} is not a directory"])
    missing = [
        f"{located.where(field)}: {_dotted(field)}: {base / value} does not exist"
        for field, value in _input_files(spec)
        if not _is_file(base / value)
    ]
    if missing:
        raise SpecError(missing)
    return LoadedSpec(
        spec=spec, path=p.resolve() if p else None, workdir=workdir, base=base, located=located
    )


_skips: dict[type, frozenset[tuple]] = {}


def _skip(model: type[Spec]) -> frozenset[tuple]:
    if model not in _skips:
        _skips[model] = frozenset(not_expanded(model))
    return _skips[model]


def _input_files(spec: Spec) -> list[tuple[tuple[str, ...], str]]:
    """Files an environment is built from (relative to the spec file), by field."""
    env = spec.environment
    if env is None:
        return []
    out = []
    if isinstance(env.requirements, str):
        out.append((("environment", "requirements"), env.requirements))
    if env.setup:
        out.append((("environment", "setup"), env.setup))
    if env.conda and env.conda.environment_file:
        out.append((("environment", "conda", "environment_file"), env.conda.environment_file))
    return out


def _line_key(problem: str) -> tuple[int, str]:
    m = re.match(r"[^:]*:(\d+):", problem)
    return (int(m.group(1)) if m else 1 << 30, problem)


def _copy(data: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH and isinstance(data, (dict, list)):
        raise SpecError([f"<spec>: nested deeper than {MAX_DEPTH} levels (or a cycle)"])
    if isinstance(data, dict):
        return {k: _copy(v, depth + 1) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v, depth + 1) for v in data]
    return data


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


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _short(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value: Any) -> str:
    return {
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
    }.get(type(value), type(value).__name__)


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


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
            problems.append(f"{where}: {field}: must be {what}, got {_show(got)}{hint}")
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
