"""An engine in one place (issue 22, item 4): each built-in engine is one folder of
trebuchet/backends/ (its options model, checks, render, submit, state mapping, diagnosis
hints), found through the registry, and diagnose/ and store/ hold no engine names.

The rule for diagnose/ and store/, read from their code (ast), not their prose:
- no import of an engine's modules (`trebuchet.backends.<engine>...`, or `from
  trebuchet.backends import <engine>`): diagnose asks `backends.get_backend(run["backend"])`
  (Backend.explain_ending), store/ does not import backends at all;
- no string literal equal to an engine's name in registry.BUILTIN (`"slurm"`, `"local"`...)
  or naming an engine's module (`"trebuchet.backends.slurm.checks:partitions"`): a branch
  on one engine's name is that engine's knowledge in the wrong place.
Docstrings and comments may mention engines, and so may user-facing prose that merely
names a spec field or a command (the catalog's remedies: "slurm.mem", "`sinfo`"): such a
literal holds more than the name. Log patterns (srun's, slurmstepd's lines) are about logs,
which come from anywhere, and stay in diagnose/.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from trebuchet import backends, registry
from trebuchet.backends.base import Backend
from trebuchet.diagnose import catalog
from trebuchet.diagnose.report import diagnose_run

PKG = Path(__file__).resolve().parents[2] / "trebuchet"
ENGINES = [r.name for r in registry.BUILTIN]


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of string statements: docstrings, and bare strings used as comments."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}  # fmt: skip


def _engine_module(dotted: str) -> str | None:
    for name in ENGINES:
        if dotted == f"trebuchet.backends.{name}" or dotted.startswith(
            tuple(f"trebuchet.backends.{name}{sep}" for sep in ".:_")  # _: the old flat modules
        ):
            return name
    return None


def _names(value: object) -> bool:
    """A literal that is an engine's name, or names one of its modules."""
    return isinstance(value, str) and (value in ENGINES or _engine_module(value) is not None)


def engine_names_in(text: str, where: str) -> list[str]:
    """Where this code names a built-in engine: `where:line: what`, in line order."""
    tree = ast.parse(text, where)
    prose = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if _engine_module(a.name)]  # fmt: skip
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if _engine_module(node.module) or any(_engine_module(n) for n in names):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Constant) and id(node) not in prose and _names(node.value):
            found.append((node.lineno, repr(node.value)))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_the_rule_sees_names_imports_and_module_strings() -> None:
    """The reading is only as good as what it catches, and what it lets through."""
    probe = (
        '"""Slurm and ssh in a docstring are fine."""\n'
        "from trebuchet.backends.slurm.checks import partitions\n"
        "import trebuchet.backends.ssh.engine\n"
        "from trebuchet.backends import local\n"
        "def f(run):\n"
        '    """slurm in a function docstring too."""\n'
        '    if run["backend"] == "slurm":  # slurm in a comment\n'
        '        return "set slurm.mem, or see `sinfo`"\n'
        '    return "trebuchet.backends.kubernetes.engine:BACKEND"\n'
    )
    found = engine_names_in(probe, "probe.py")
    assert [f.split(": ", 1)[1] for f in found] == [
        "from trebuchet.backends.slurm.checks import ...",
        "import trebuchet.backends.ssh.engine",
        "from trebuchet.backends import ...",
        "'slurm'",
        "'trebuchet.backends.kubernetes.engine:BACKEND'",
    ], found


@pytest.mark.parametrize("part", ["diagnose", "store"])
def test_diagnose_and_store_hold_no_engine_names(part: str) -> None:
    found = [hit for path in sorted((PKG / part).rglob("*.py"))
             for hit in engine_names_in(path.read_text(), str(path.relative_to(PKG.parent)))]  # fmt: skip
    assert not found, "engine knowledge belongs to the engine's folder:\n" + "\n".join(found)


@pytest.mark.parametrize("name", ENGINES)
def test_each_built_in_engine_is_one_folder(name: str) -> None:
    """Its engine and options modules in backends/<name>/, whose __init__.py imports
    nothing (the registry imports the one module a verb needs: `treb ps` stays light), and
    no module of it left beside the shared ones."""
    reg = registry.registry[name]
    for target in (reg.engine, reg.options):
        if isinstance(target, str):
            assert target.startswith(f"trebuchet.backends.{name}."), target
    folder = PKG / "backends" / name
    init = ast.parse((folder / "__init__.py").read_text())
    assert ast.get_docstring(init), f"{folder}/__init__.py: say what the engine is"
    imports = [n for n in ast.walk(init) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not imports, f"{folder}/__init__.py imports: keep it to its docstring"
    strays = sorted(p.name for p in (PKG / "backends").glob(f"{name}*.py"))
    assert not strays, f"engine modules outside backends/{name}/: {strays}"
    assert isinstance(backends.get_backend(name), Backend)


# -- what an engine says of its runs, through the registry --------------------------------
class Said(Backend):
    """An engine with its own word on a lost or refused run (no other method is used)."""

    name = "said"
    remote = False

    def check(self, loaded: Any) -> None: ...
    def submit(self, sub: Any, attach: bool) -> Any: ...
    def refresh(self, store: Any, runs: list[Any]) -> None: ...
    def cancel(self, store: Any, run: Any) -> None: ...

    def render(self, loaded: Any) -> str:
        return ""

    def explain_ending(self, run: dict[str, Any]) -> dict[str, Any] | None:
        if run["state"] == "FAILED":
            return {"category": "scheduler_refusal", "summary": "said refused the job",
                    "evidence": [str(run.get("reason"))], "resources": "queues here: q1 (4 GPUs)"}  # fmt: skip
        if run.get("backend_id"):
            return {"category": "node_failure", "summary": f"job {run['backend_id']} is gone",
                    "evidence": [], "fix": "ask said"}  # fmt: skip
        return None


@pytest.fixture
def said(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine registered for this test only (the registry is restored after)."""
    monkeypatch.setattr(registry, "registry", dict(registry.registry))
    monkeypatch.setattr(registry, "engines", dict(registry.engines))
    monkeypatch.setattr(registry, "_generation", registry._generation)
    backends.register("said", Said)


def test_diagnose_asks_the_runs_engine(said: None, tmp_path: Path) -> None:
    run = {"id": "ab12", "run_dir": str(tmp_path), "backend": "said", "attempt": 0,
           "host": "h1", "supervisor_pid": 7}  # fmt: skip
    d = diagnose_run({**run, "state": "FAILED", "reason": "no queue fits"})
    assert (d.category, d.summary, d.evidence) == (
        "scheduler_refusal", "said refused the job", ["no queue fits"])  # fmt: skip
    assert "queues here: q1 (4 GPUs)" in d.remedy and catalog.SINFO_HINT not in d.remedy
    d = diagnose_run({**run, "state": "LOST", "backend_id": "j9"})
    assert (d.category, d.summary, d.remedy) == ("node_failure", "job j9 is gone", "ask said")
    # the engine says nothing: what diagnose says of any engine's lost run
    d = diagnose_run({**run, "state": "LOST"})
    assert d.category == "node_failure" and "supervisor (pid 7 on h1) vanished" in d.summary
    # an engine not installed here: the same
    d = diagnose_run({**run, "backend": "gone-engine", "state": "LOST"})
    assert "supervisor (pid 7 on h1) vanished" in d.summary


def test_rebuild_reads_any_engines_backend_id(tmp_path: Path) -> None:
    from trebuchet.store.rebuild import recover

    def events(*evs: dict[str, Any]) -> Path:
        run_dir = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
        return run_dir

    new = events({"event": "submitted", "backend": "said", "time": 1.0},
                 {"event": "said_submit", "queue": "q1", "backend_id": "q1/7", "time": 2.0})  # fmt: skip
    rec = recover(new, {}).record
    assert (rec.backend, rec.backend_id) == ("said", "q1/7")
    old = events({"event": "submitted", "backend": "said", "time": 1.0},
                 {"event": "said_submit", "job_id": 4242, "time": 2.0},  # before backend_id
                 {"event": "said_failed", "reason": "refused", "time": 3.0})  # fmt: skip
    rec = recover(old, {}).record
    assert (rec.backend_id, rec.state, rec.ended_at) == ("4242", "FAILED", 3.0)
    assert recover(events({"event": "run_started", "time": 1.0}), {}).record.backend == "local"
