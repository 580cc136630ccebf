"""The package's layers, kept by a test: every import in trebuchet/ (at module level and
inside functions; those under `if TYPE_CHECKING:` are for annotations only and do not
count), grouped by part (trebuchet/<part>/ or trebuchet/<part>.py).

- No cycle between parts: each part can be read, tested and changed with only the parts
  below it in mind (docs/architecture.md draws the order).
- The front doors (cli/, ui/, api.py, __main__.py) may import anything; nothing else may
  import them.
- runtime/ imports nothing of the package outside itself: it is shipped to the nodes as a
  file of its own (launcher/runtime_file.py) and runs where trebuchet is not installed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "trebuchet"
FRONT_DOORS = {"cli", "ui", "api", "__main__"}

Edges = dict[str, dict[str, list[str]]]  # part -> part it imports -> where ("file:line")


def _module(path: Path) -> list[str]:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _part(dotted: list[str]) -> str | None:
    """The part of a module of the package; None outside it or for the package itself."""
    return dotted[1] if len(dotted) > 1 and dotted[0] == "trebuchet" else None


def _typing_only(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return found


def _targets(node: ast.AST, module: list[str], is_package: bool) -> list[list[str]]:
    if isinstance(node, ast.Import):
        return [alias.name.split(".") for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        base = (node.module or "").split(".")
    else:  # relative: from this module's package, `level` packages up
        package = module if is_package else module[:-1]
        base = package[: len(package) - node.level + 1] + (node.module or "").split(".")
    base = [b for b in base if b]
    if len(base) == 1 and base[0] == "trebuchet":  # `from trebuchet import runner`
        return [["trebuchet", alias.name] for alias in node.names]
    return [base]


def edges() -> Edges:
    out: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(PKG.rglob("*.py")):
        module = _module(path)
        me = _part(module)
        if me is None:
            continue  # trebuchet/__init__.py: the package's own face
        tree = ast.parse(path.read_text(), str(path))
        skip = _typing_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for target in _targets(node, module, path.name == "__init__.py"):
                other = _part(target)
                if other is not None and other != me:
                    out[me][other].append(f"{path.relative_to(PKG.parent)}:{node.lineno}")
    return out


def cycles(graph: Edges) -> list[list[str]]:
    """The strongly connected parts (Tarjan), each of more than one part."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walker_sees_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    """The rules below are only as good as the reading: a function-level import, a
    relative one and `from trebuchet import x` all count; TYPE_CHECKING imports do not."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from trebuchet import runner\n"
        "if TYPE_CHECKING:\n    from trebuchet.cli import main\n"
        "def f():\n    from trebuchet.store.db import Store\n"
    )
    tree = ast.parse(src)
    skip = _typing_only(tree)
    module = ["trebuchet", "launcher", "x"]
    seen = [t for n in ast.walk(tree) if id(n) not in skip for t in _targets(n, module, False)]
    parts = {_part(t) for t in seen}
    assert {"launcher", "runner", "store"} <= parts and "cli" not in parts, seen


def test_no_cycle_between_parts() -> None:
    graph = edges()
    inner = {a: {b: w for b, w in outs.items() if b not in FRONT_DOORS}
             for a, outs in graph.items() if a not in FRONT_DOORS}  # fmt: skip
    problems = []
    for group in cycles(inner):
        ties = [f"{a} -> {b} ({inner[a][b][0]})" for a in group for b in inner.get(a, {})
                if b in group]  # fmt: skip
        problems.append(f"cycle of {', '.join(group)}: " + "; ".join(ties))
    assert not problems, "\n".join(problems)


def test_only_front_doors_import_front_doors() -> None:
    graph = edges()
    bad = [f"{a} imports the front door {b}: {', '.join(where[:3])}"
           for a, outs in graph.items() if a not in FRONT_DOORS
           for b, where in outs.items() if b in FRONT_DOORS]  # fmt: skip
    assert not bad, "\n".join(bad)


def test_runtime_imports_only_itself() -> None:
    outs = edges().get("runtime", {})
    assert not outs, {b: w[:3] for b, w in outs.items()}


# runtime/'s sub-packages by role, lowest first: each imports only those before it.
RUNTIME_ROLES = ["contracts", "rundir", "process", "watch", "publish", "job", "node", "slurm"]


def test_runtime_roles_import_only_the_roles_before_them() -> None:
    import ast

    root = Path(__file__).resolve().parents[2] / "trebuchet" / "runtime"
    bad = []
    for role in RUNTIME_ROLES:
        for path in sorted((root / role).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.level < 2:
                    continue  # level 1: the same role
                target = (node.module or node.names[0].name).split(".")[0]
                if target in RUNTIME_ROLES and (
                    RUNTIME_ROLES.index(target) >= RUNTIME_ROLES.index(role)
                ):
                    bad.append(f"runtime/{role}/{path.name}:{node.lineno} imports {target}")
    assert not bad, "\n".join(bad)
    assert sorted(p.name for p in root.glob("*.py")) == [
        "__init__.py", "__main__.py", "command_line.py"]  # fmt: skip
