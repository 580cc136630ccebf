"""Spec file -> validated spec, with every problem reported as `file:line: field: why`.

Validation itself (pydantic, the spec models) is in validate.py and runs only when the spec
cache (cache.py) has no entry for this spec: a cached `treb run` imports neither pydantic
nor yaml.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.errors import SpecError, UserError
from trebuchet.plain import record
from trebuchet.spec import cache
from trebuchet.spec.source import MAX_DEPTH, Located, read_spec, shortened
from trebuchet.spec.source import dotted as _dotted

if TYPE_CHECKING:
    from trebuchet.spec.model import Spec


@record
class LoadedSpec:
    """A validated spec and where it came from."""

    spec: Spec
    path: Path | None
    workdir: Path
    base: Path = Path(".")  # the spec file's folder: environment files are relative to it
    # The workdir the run's code snapshot was taken from, once `workdir` is that snapshot
    # (launcher/submit.py): the environment's files are found there, shipped in the copy.
    origin: Path | None = None
    located: Located | None = None
    # The resolved spec as YAML with a placeholder for the workdir (resolved.py).
    resolved: str | None = None
    # `--after`: the runs it waits for (store/after.py), set by the runner; an engine's
    # check refuses what it cannot wait for, its render and submit say how it waits.
    after: list[dict[str, Any]] | None = None

    @property
    def source(self) -> str:
        return str(self.path) if self.path else "<spec>"

    def where(self, *path: str) -> str:
        """`file:line` of a field, for errors found after validation (by a backend)."""
        return self.located.where(path) if self.located else self.source

    def refusal(self, field: str, why: str) -> UserError:
        """An engine's refusal of a field, said as validation says its errors. A field the
        file lacks is said where it would go: the line of its block, or the file alone
        (never the first line, `name:`, which is not about it)."""
        path = tuple(field.split("."))
        if self.located is None:
            return UserError(f"{self.source}: {field}: {why}")
        if self.path is None and self.located.at(path) is None:  # a spec made from a command
            return UserError(f"{field}: {why}; without a spec file: -o {field}=VALUE")
        located = self.located
        n = next((n for n in range(len(path), 0, -1) if located.at(path[:n]) is not None), 0)
        where = self.located.at(path[:n]) if n else None
        if n == len(path):
            return UserError(f"{where}: {field}: {why}")
        if where is not None:
            block = ".".join(path[:n])
            missing = f"; the {block}: block there has no {path[n]}:"
            return UserError(f"{where}: {field}: {why}{missing}")
        hint = f"; the file has no {path[0]}: block" if len(path) > 1 else ""
        return UserError(f"{self.source}: {field}: {why}{hint}")


def default_name(path: Path | None) -> str:
    """A valid run name from the file's stem ("My Job.yaml" -> "my-job")."""
    stem = path.stem if path else "job"
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return (name or "job")[:63]


# Files `treb run` is handed instead of a spec: what they are, and the program that runs them.
SCRIPTS = {".py": ("a Python script", "python"), ".sh": ("a shell script", "bash"),
           ".bash": ("a shell script", "bash")}  # fmt: skip


def not_a_spec(p: Path) -> str | None:
    """The message for a script given where a spec belongs: what it is and the smallest
    spec that runs it."""
    kind = SCRIPTS.get(p.suffix.lower())
    if kind is None or not os.path.isfile(p):
        return None
    import shlex

    what, program = kind
    spec = p.with_suffix(".yaml")
    lines = [f"name: {default_name(p)}", f"command: {program} {shlex.quote(p.name)}",
             "nodes: 1", "procs_per_node: 1"]  # fmt: skip
    body = "\n".join(f"    {line}" for line in lines)
    now = shlex.join([p.name] if program == "python" else ["--", program, p.name])
    return (
        f"{p} is {what}, not a spec: treb runs a YAML spec that says how to start it. "
        f"The smallest one, saved as {spec} next to it:\n{body}\n"
        f"  then: treb run {shlex.quote(str(spec))} (docs/spec.md lists every field)\n"
        f"  or run it without a spec, from its folder: treb run -n 2 {now}"
    )


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """`key.sub=value` -> (("key", "sub"), value). The value stays the text typed
    (env.LR=0.10 stays "0.10"); only flow collections, quoted strings and null are YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or any(not p for p in key.strip().split(".")):
        raise UserError(f"-o {text}: expected key.sub=value")
    parsed: Any = value
    from trebuchet.spec.yamlsrc import yaml_value as _yaml_value

    stripped = value.strip()
    if stripped[:1] in ("[", "{", '"', "'") or stripped in ("null", "~"):
        try:
            parsed = _yaml_value(stripped)
        except ValueError as exc:
            raise UserError(f"-o {shortened(text, 80)}: the value is not valid: {exc}") from None
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
    cached: bool = True,
) -> LoadedSpec:
    """Load, expand, override and validate a spec from a file, YAML text or a dict.
    `cached=False`: not looked up nor kept (a sweep's points would crowd the cache out)."""
    environ = os.environ if environ is None else environ
    p = Path(path) if path is not None else None
    source = str(p) if p else "<spec>"
    key = None
    if data is None and text is None:
        if p is None:
            raise UserError("no spec given")
        script = not_a_spec(p)
        if script:
            raise UserError(script)
        text = read_spec(p)
        if cached and cache.usable():
            key = cache.entry_key(p.resolve(), text, list(overrides))
    elif data is not None and cached and cache.usable() and _json_native(data):
        # a command's spec (cli/specless.py), or launch()'s dict when JSON holds it as it is
        with contextlib.suppress(ValueError):  # NaN, inf
            text_of_data = json.dumps(data, sort_keys=True, allow_nan=False)
            key = cache.entry_key(Path("<command>"), text_of_data, list(overrides))
    if key is not None:
        entry = cache.lookup(key, environ)
        if entry is not None:
            return _from_cache(entry, p)
    if data is not None:
        located = Located(_copy(data), {(): 1}, source)
    else:
        from trebuchet.spec.yamlsrc import parse_yaml

        located = parse_yaml(text or "", source)
    if located.data is not None and not isinstance(located.data, dict):
        raise SpecError(
            [f"{source}:1: the spec must be a mapping of fields, got {_kind(located.data)}"]
        )
    apply_overrides(located, overrides)
    from trebuchet.spec import validate

    seen = cache.Recording(environ)
    spec = validate.validate(located, p, seen)
    loaded = _placed(spec, p, located)
    if key is not None:
        entry = validate.cache_entry(loaded)
        if entry is not None:
            cache.store(key, entry, seen.seen, environ)
            loaded.resolved = entry["resolved"]
            if cache.always():  # the tests' mode: what was stored is what is used, at once
                return _from_cache(json.loads(json.dumps(entry)), p)
    return loaded


def _from_cache(entry: dict[str, Any], p: Path | None) -> LoadedSpec:
    from trebuchet.spec.frozen import from_entry

    spec, located = from_entry(entry)
    return _placed(spec, p, located, entry["resolved"])


def _placed(
    spec: Spec, p: Path | None, located: Located, resolved: str | None = None
) -> LoadedSpec:
    """The validated spec with its folders, checked on every load, cached or not."""
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
        for field, value in input_files(spec)
        if not _is_file(base / value)
    ]
    if missing:
        raise SpecError(missing)
    return LoadedSpec(
        spec=spec, path=p.resolve() if p else None, workdir=workdir, base=base,
        located=located, resolved=resolved,
    )  # fmt: skip


def input_files(spec: Spec) -> list[tuple[tuple[str, ...], str]]:
    """Files an environment is built from (relative to the spec file), by field."""
    env = spec.environment
    if env is None:
        return []
    out: list[tuple[tuple[str, ...], str]] = []
    if isinstance(env.requirements, str):
        out.append((("environment", "requirements"), env.requirements))
    if env.setup:
        out.append((("environment", "setup"), env.setup))
    if env.conda and env.conda.environment_file:
        out.append((("environment", "conda", "environment_file"), env.conda.environment_file))
    return out


def _json_native(data: Any, depth: int = 0) -> bool:
    """Whether JSON writes `data` as it is: a tuple (written as a list) or a key True or
    None (written "true", "null") would share a cached dict's key where validation refuses
    them; nesting deeper than a spec may be is left to validation (not the JSON encoder's
    RecursionError)."""
    if depth > MAX_DEPTH:
        return False
    if type(data) is dict:
        return all(type(k) is str and _json_native(v, depth + 1) for k, v in data.items())
    if type(data) is list:
        return all(_json_native(v, depth + 1) for v in data)
    return data is None or type(data) in (str, int, float, bool)


def _copy(data: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH and isinstance(data, (dict, list)):
        raise SpecError([f"<spec>: nested deeper than {MAX_DEPTH} levels (or a cycle)"])
    if isinstance(data, dict):
        return {k: _copy(v, depth + 1) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v, depth + 1) for v in data]
    return data


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


def _kind(value: Any) -> str:
    return {
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
    }.get(type(value), type(value).__name__)
