"""The spec cache (trebuchet/spec/cache.py): a spec seen before is used without pydantic, and
says exactly what validating it again would say; anything validation read that changed
makes it validate again; a mistake is never cached; a damaged cache is only a miss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trebuchet.errors import SpecError
from trebuchet.spec import cache, resolved
from trebuchet.spec.load import LoadedSpec, load_spec

RICH = """\
name: rich
command: [python, train.py, --lr, "${LR}"]  # never expanded: the shell's
procs_per_node: 3
nodes: 2
env:
  DATA: ${DATA_DIR}/set
  LRATE: ${LR:-0.1}
  TOKEN_REF: ${SECRET_TOKEN}
secrets: [SECRET_TOKEN]
environment:
  requirements: requirements.txt
  setup: setup.sh
timeout: 2h
grace_period: 7
master_port: 29555
log_policies:
  - name: oom
    pattern: "CUDA out of memory"
    action: no_retry
metrics:
  prefix: "metrics:"
tracking:
  wandb:
    project: proj
results:
  ranks: mean
slurm:
  partition: gpu
"""


@pytest.fixture
def spec_dir(treb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("TREB_SPEC_CACHE", raising=False)  # CI runs the suite once as "always"
    monkeypatch.setenv("DATA_DIR", "/data")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "requirements.txt").write_text("numpy\n")
    (folder / "setup.sh").write_text("true\n")
    (folder / "job.yaml").write_text(RICH)
    return folder


def entries(treb_home: Path) -> list[Path]:
    folder = treb_home / "cache" / "specs-2"
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def cached(loaded: LoadedSpec) -> bool:
    return type(loaded.spec).__name__.startswith("Frozen")


def test_a_cached_spec_says_what_validation_says(spec_dir: Path, treb_home: Path) -> None:
    first = load_spec(spec_dir / "job.yaml", ["slurm.qos=high"])
    again = load_spec(spec_dir / "job.yaml", ["slurm.qos=high"])
    assert not cached(first) and cached(again)
    assert len(entries(treb_home)) == 1
    a, b = first.spec, again.spec
    assert a.model_dump(mode="json") == b.model_dump(mode="json") == b.model_dump()
    for fact in ("ranks_per_node", "world_size", "fixed_port", "warning_seconds"):
        assert getattr(a, fact) == getattr(b, fact), fact
    assert (b.ranks_per_node, b.world_size, b.fixed_port) == (3, 6, 29555)
    assert a.environment.kind == b.environment.kind == "venv"
    assert b.env == {"DATA": "/data/set", "LRATE": "0.1", "TOKEN_REF": "${SECRET_TOKEN}"}
    assert b.command == ["python", "train.py", "--lr", "${LR}"]
    assert [p.model_dump() for p in a.log_policies] == [p.model_dump() for p in b.log_policies]
    assert b.log_policies[0].pattern == "CUDA out of memory"
    assert b.tracking.wandb.project == "proj" and b.tracking.mlflow is None
    for block in ("slurm", "metrics", "tracking", "results", "kubernetes"):
        assert getattr(a, block).model_fields_set == getattr(b, block).model_fields_set, block
    assert b.slurm.model_fields_set == {"partition", "qos"}
    assert a.model_fields_set == b.model_fields_set
    for path in [("env", "DATA"), ("slurm", "partition"), ("slurm", "qos"),
                 ("log_policies", 0, "pattern"), ("timeout",), ("nope",)]:  # fmt: skip
        assert first.where(*path) == again.where(*path), path
    assert again.where("slurm", "qos") == "-o slurm.qos=high"
    assert again.where("env", "DATA").endswith("job.yaml:6")
    assert (first.path, first.workdir, first.base) == (again.path, again.workdir, again.base)
    with pytest.raises(AttributeError):
        _ = b.no_such_field
    # spec.yaml and spec.json of a run: the same from either, whatever the workdir's name,
    # and the template filled in is what a whole dump by yaml writes
    long = "/runs/" + "y" * 200 + " z"
    for workdir in ("/runs/abc/code", "/runs/a b/c: d", "/runs/é/x", "/runs/#x/y", long):
        first.workdir = again.workdir = Path(workdir)
        assert resolved.text(first) == resolved.text(again) == resolved._dump(again, workdir)
        assert resolved.data(first) == resolved.data(again)
    again.workdir = Path("/runs/#x/y")
    assert "\nworkdir: /runs/#x/y\n" in resolved.text(again)  # as yaml writes it


def test_whatever_validation_read_that_changed_validates_again(
    spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = spec_dir / "job.yaml"
    assert load_spec(path).spec.env["DATA"] == "/data/set"
    monkeypatch.setenv("DATA_DIR", "/elsewhere")  # a variable it expanded
    loaded = load_spec(path)
    assert not cached(loaded) and loaded.spec.env["DATA"] == "/elsewhere/set"
    monkeypatch.setenv("LR", "0.5")  # set now: ${LR:-0.1} reads it
    assert load_spec(path).spec.env["LRATE"] == "0.5"
    assert cached(load_spec(path))
    assert load_spec(path, ["nodes=3"]).spec.nodes == 3  # another override
    path.write_text(RICH.replace("nodes: 2", "nodes: 4"))  # the file's bytes
    assert load_spec(path).spec.nodes == 4
    monkeypatch.delenv("DATA_DIR")  # now unset, without a default: refused, cached or not
    with pytest.raises(SpecError, match="DATA_DIR"):
        load_spec(path)


def test_a_mistake_is_never_cached(spec_dir: Path, treb_home: Path) -> None:
    bad = spec_dir / "bad.yaml"
    bad.write_text("command: [python, x.py]\nnodes: many\n")
    for _ in range(2):
        with pytest.raises(SpecError, match="bad.yaml:2: nodes: must be an integer"):
            load_spec(bad)
    assert entries(treb_home) == []


def test_the_filesystem_is_checked_on_every_load(spec_dir: Path) -> None:
    path = spec_dir / "job.yaml"
    load_spec(path)
    assert cached(load_spec(path))
    (spec_dir / "setup.sh").unlink()
    with pytest.raises(SpecError, match=r"job.yaml:\d+: environment.setup: .*does not exist"):
        load_spec(path)
    (spec_dir / "setup.sh").write_text("true\n")
    path.write_text(RICH + "workdir: sub\n")
    (spec_dir / "sub").mkdir()
    assert load_spec(path).workdir == spec_dir / "sub"
    (spec_dir / "sub").rmdir()
    with pytest.raises(SpecError, match="workdir: .* is not a directory"):
        load_spec(path)


@pytest.mark.parametrize(
    "damage",
    [b"", b"{not json", b"\x00\xff\xfe", b'{"format": 1, "key": 3}', b"[]", None],
    ids=["empty", "truncated", "binary", "wrong-types", "a-list", "a-folder"],
)
def test_a_damaged_cache_is_only_a_miss(spec_dir: Path, treb_home: Path, damage) -> None:
    path = spec_dir / "job.yaml"
    want = load_spec(path).spec.model_dump(mode="json")
    (entry,) = entries(treb_home)
    if damage is None:  # the entry's name taken by a folder: it cannot be read or replaced
        entry.unlink()
        entry.mkdir()
    else:
        entry.write_bytes(damage)
    for _ in range(2):
        loaded = load_spec(path)
        assert loaded.spec.model_dump(mode="json") == want
    entry_data = json.loads(entry.read_text()) if entry.is_file() else {}
    if damage is not None:  # rewritten whole by the next validation
        assert entry_data["format"] == cache.FORMAT and entry_data["data"] == want


def test_an_unwritable_cache_costs_only_speed(spec_dir: Path, treb_home: Path) -> None:
    treb_home.mkdir(exist_ok=True)
    (treb_home / "cache").write_text("a file where the cache folder would be\n")
    for _ in range(2):
        loaded = load_spec(spec_dir / "job.yaml")
        assert not cached(loaded) and loaded.spec.nodes == 2


def test_off_switch(spec_dir: Path, treb_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREB_SPEC_CACHE", "0")
    load_spec(spec_dir / "job.yaml")
    assert not cached(load_spec(spec_dir / "job.yaml")) and entries(treb_home) == []


def test_sweep_points_are_not_kept(spec_dir: Path, treb_home: Path) -> None:
    """A sweep's points (`cached=False` from the runner) would crowd the cache out."""
    for lr in ("0.1", "0.2"):
        loaded = load_spec(spec_dir / "job.yaml", [f"env.LRATE={lr}"], cached=False)
        assert not cached(loaded) and loaded.spec.env["LRATE"] == lr
    assert entries(treb_home) == []


def test_an_engine_registered_here_is_never_served_from_the_cache(spec_dir: Path) -> None:
    load_spec(spec_dir / "job.yaml")  # cached for the built-in engines
    code = (
        "import sys\nfrom pydantic import BaseModel\nfrom trebuchet import backends\n"
        "from trebuchet.spec.load import load_spec\n"
        "class Opts(BaseModel):\n    zone: str = 'a'\n"
        "backends.register('mine', 'trebuchet.backends.local.engine:BACKEND', Opts)\n"
        "s = load_spec(sys.argv[1]).spec\nprint(type(s).__name__, s.mine.zone)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(spec_dir / "job.yaml")],
                         capture_output=True, text=True, env=os.environ, check=True)  # fmt: skip
    assert out.stdout.split() == ["Spec", "a"]


def test_models_have_nothing_the_cached_view_lacks() -> None:
    """A property or method on a spec model must be in facts.py (FACTS), which the cached
    view also has; else a cached spec would miss it."""
    from pydantic import BaseModel

    from trebuchet.spec.facts import FACTS
    from trebuchet.spec.model import spec_model

    seen: set[type] = set()
    todo: list[type] = [spec_model()]
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for info in model.model_fields.values():
            for cand in (info.annotation, *getattr(info.annotation, "__args__", ())):
                for c in (cand, *getattr(cand, "__args__", ())):
                    if isinstance(c, type) and issubclass(c, BaseModel):
                        todo.append(c)
    assert len(seen) >= 12
    for model in seen:
        own = set()
        for klass in model.__mro__:
            if klass.__module__.startswith("pydantic") or klass is object:
                continue
            own |= {n for n, v in vars(klass).items() if not n.startswith("_")
                    and (isinstance(v, property) or callable(v))}  # fmt: skip
        facts = FACTS.get(model.__name__)
        provided = {n for n in dir(facts) if not n.startswith("_")} if facts else set()
        assert own <= provided, (model.__name__, own - provided)


def test_a_second_treb_run_imports_neither_pydantic_yaml_nor_dataclasses(
    spec_dir: Path, treb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (spec_dir / "noop.yaml").write_text("command: [python, -c, 'print(42)']\nprocs_per_node: 2\n")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "trebuchet", "run", "noop.yaml"],
            cwd=spec_dir, capture_output=True, text=True, timeout=120, env=os.environ,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()
                    if line.startswith("import time:")}  # fmt: skip
        runs.append(imported)
    assert {"pydantic", "yaml"} <= runs[0]
    # nor dataclasses and inspect (trebuchet/plain.py): ~20 ms before the first rank
    assert not {"pydantic", "yaml", "dataclasses", "inspect"} & runs[1]
    dirs = sorted((treb_home / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
    specs = [(d / "spec.yaml").read_text().replace(d.name, "RUN") for d in dirs]
    assert specs[0] == specs[1]
    data = [json.loads((d / "spec.json").read_text()) for d in dirs]
    assert data[0]["workdir"] != data[1]["workdir"]
    assert {**data[0], "workdir": ""} == {**data[1], "workdir": ""}
    logs = [(d / "attempt-0" / "rank-1.log").read_text() for d in dirs]
    assert logs == ["42\n", "42\n"]


def test_no_value_of_a_variable_reaches_the_cache(tmp_path: Path, treb_home: Path) -> None:
    """Validation reads the variables a command names (an empty expansion is refused), a
    secret's among them; the entry keeps a salted digest of each, never its value, and
    still misses when one changes. Format 1 entries, which kept values, are removed."""
    old = treb_home / "cache" / "specs"
    old.mkdir(parents=True)
    (old / "x.json").write_text('{"env": {"HF_TOKEN": "hf_old_value_on_disk"}}')
    path = tmp_path / "job.yaml"
    path.write_text('command: \'test "$HF_TOKEN" = "$EXPECTED" && echo ok\'\nsecrets: [HF_TOKEN]\n')
    env = {"HF_TOKEN": "hf_s3cr3t_value", "EXPECTED": "hf_s3cr3t_value"}
    load_spec(path, environ=env)
    assert cached(load_spec(path, environ=env))
    for f in treb_home.rglob("*"):
        assert (
            not f.is_file() or b"s3cr3t" not in f.read_bytes() and b"hf_old" not in f.read_bytes()
        )
    assert not cached(load_spec(path, environ={**env, "EXPECTED": "other"}))


def test_a_command_typed_as_for_torchrun_is_cached_as_a_spec_file_is(
    spec_dir: Path, treb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`treb run -n 2 script.py` again: no pydantic (0.33 s -> ~0.14 s here), the same spec
    recorded; another flag, argument or folder is validated again."""
    (spec_dir / "show.py").write_text(
        "import os, sys\nprint(os.environ['WORLD_SIZE'], sys.argv[1:])\n"
    )
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)

    def run(*argv: str) -> set[str]:
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "trebuchet", "run", *argv],
            cwd=spec_dir, capture_output=True, text=True, timeout=120, env=os.environ,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        return {line.split("|")[-1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:")}  # fmt: skip

    first, second = run("-n", "2", "show.py", "a"), run("-n", "2", "show.py", "a")
    assert "pydantic" in first and "pydantic" not in second
    assert "pydantic" in run("-n", "3", "show.py", "a")  # another flag: validated again
    assert "pydantic" in run("-n", "2", "show.py", "b")  # another argument
    dirs = sorted((treb_home / "runs").iterdir(), key=lambda d: d.stat().st_mtime)
    specs = [(d / "spec.yaml").read_text() for d in dirs]
    assert specs[0] == specs[1] and specs[1] != specs[2] and specs[1] != specs[3]
    logs = [(d / "attempt-0" / "rank-0.log").read_text() for d in dirs]
    assert logs == ["2 ['a']\n", "2 ['a']\n", "3 ['a']\n", "2 ['b']\n"]


def test_a_dict_that_json_would_change_is_validated_not_served_from_the_cache(
    spec_dir: Path, treb_home: Path
) -> None:
    """launch()'s dict: a tuple for a list, True or None for a key "true" or "null" write
    the same JSON as the cached dict, but validation refuses them; a dict nested deeper
    than a spec may be is refused by name, never a RecursionError from the JSON encoder."""
    base = {"name": "x", "command": "python t.py"}
    for good, bad in [({**base, "command": ["python", "t.py"]}, {**base, "command": ("python", "t.py")}),
                      ({**base, "env": {"true": "1"}}, {**base, "env": {True: "1"}}),
                      ({**base, "env": {"null": "1"}}, {**base, "env": {None: "1"}})]:  # fmt: skip
        load_spec(data=good)
        assert cached(load_spec(data=good))
        with pytest.raises(SpecError):
            load_spec(data=bad, cached=False)  # the oracle: validation refuses it
        with pytest.raises(SpecError):
            load_spec(data=bad)
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = node = {}
    with pytest.raises(SpecError, match="nested deeper"):
        load_spec(data={**base, "env": deep})


def test_a_commands_sweep_points_are_not_cached(spec_dir: Path, treb_home: Path) -> None:
    """A sweep's points are loaded uncached (they would crowd the cache out): a command's
    (`treb run --sweep -o env.X=1,2,3 t.py`) as a spec file's, only its base is kept."""
    from trebuchet import runner

    data = {"name": "x", "command": "python t.py"}
    checked = runner.check(data, "local", ["env.X=1,2,3,4"], preflight=False, multirun=True)
    assert len(checked.points) == 4
    assert len(entries(treb_home)) == 1
