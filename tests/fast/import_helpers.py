"""Shared by the test_import_* files: run `treb import`, load what it wrote."""

from __future__ import annotations

from pathlib import Path

import yaml

from trebuchet.cli.main import main
from trebuchet.spec.load import LoadedSpec, load_spec

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "import"
# ${HOME} is the one variable an imported spec may reference (NeMo's hf_home: ~/...).
ENVIRON = {"HOME": "/home/user"}


def run_import(capsys, kind: str, name: str, *extra: str) -> tuple[str, str, int]:
    code = main(["import", kind, str(FIXTURES / name), *extra])
    out = capsys.readouterr()
    return out.out, out.err, code


def imported(capsys, tmp_path: Path, kind: str, name: str, *extra: str):
    """(the spec as data, stderr lines, LoadedSpec) - the spec must load with no error."""
    out, err, code = run_import(capsys, kind, name, *extra)
    assert code == 0, err
    path = tmp_path / "job.yaml"
    path.write_text(out)
    loaded: LoadedSpec = load_spec(path, environ=ENVIRON)
    return yaml.safe_load(out), err.splitlines(), loaded


def notes_at(err: list[str], line: int) -> list[str]:
    return [e for e in err if f":{line}: " in e]
