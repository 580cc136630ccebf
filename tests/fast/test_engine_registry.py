"""Engines come from a registry: a third-party engine is one module plus its registration.

Why: `--on NAME` must reach an engine trebuchet does not ship, with its own spec block
(file:line errors as for any field), its preflight check and its perf.csv column, through
the same runner as the built-in engines. The tiny engine (tests/fixtures/engines) is
registered here with the function entry point loading uses, and found through a real
entry point (a dist-info on sys.path) in a child process.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_spec
from trebuchet import backends, registry
from trebuchet.cli.main import main
from trebuchet.store.db import Store

ENGINES = Path(__file__).resolve().parent.parent / "fixtures" / "engines"
BUILTIN = "local, slurm, skypilot, ssh, kubernetes"


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch, treb_home: Path) -> None:
    """The tiny engine registered for this test only (the registry is restored after)."""
    monkeypatch.syspath_prepend(str(ENGINES))
    monkeypatch.setattr(registry, "registry", dict(registry.registry))
    monkeypatch.setattr(registry, "engines", dict(registry.engines))
    monkeypatch.setattr(registry, "_generation", registry._generation)
    backends.register("tiny", "tiny_engine:TinyEngine")  # as load_entry_points() does


def test_render_and_run_on_a_registered_engine(tiny, tmp_path: Path, capsys) -> None:
    spec = write_spec(
        tmp_path, "name: hi\ncommand: 'echo performance: 7 items_per_second'\n"
        "tiny:\n  greeting: hi there\n",
    )  # fmt: skip
    assert main(["render", str(spec), "--on", "tiny"]) == 0
    assert capsys.readouterr().out == (
        "# tiny engine: hi\necho 'hi there'\necho performance: 7 items_per_second\n"
    )
    assert main(["run", str(spec), "--on", "tiny"]) == 0
    err = capsys.readouterr().err
    assert " on tiny; run dir " in err and "performance: 7 items_per_second" in err
    [rec] = Store().list()
    assert (rec.backend, rec.state, rec.exit_code) == ("tiny", "SUCCEEDED", 0)
    log = Path(rec.run_dir) / "attempt-0" / "rank-0.log"
    assert log.read_text() == "hi there\nperformance: 7 items_per_second\n"
    assert main(["results", rec.id, "--csv", str(tmp_path / "perf.csv")]) == 0
    with open(tmp_path / "perf.csv") as fh:
        [row] = list(csv.DictReader(fh))
    assert (row["deployment_type"], row["performance"]) == ("tiny-box", "7")
    assert main(["run", str(spec), "--on", "tiny", "-o", "command=exit 3"]) == 1


def test_engine_block_errors_name_the_file_and_line(tiny, tmp_path: Path, capsys) -> None:
    cases = [
        ("tiny:\n  greting: x\n", "3: tiny.greting: unknown field; did you mean 'greeting'?"),
        ("tiny:\n  loud: maybe\n", "3: tiny.loud: must be true or false, got 'maybe'"),
        ("greeting: x\n", "2: greeting: unknown field; did you mean 'tiny.greeting'?"),
    ]
    for text, want in cases:
        spec = write_spec(tmp_path, "command: x\n" + text)
        assert main(["render", str(spec), "--on", "tiny"]) == 2
        assert f"treb: {spec}:{want}" in capsys.readouterr().err
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["tiny"]["$ref"] == "#/$defs/TinyOptions"
    tiny_block = schema["$defs"]["TinyOptions"]
    assert "greeting" in tiny_block["properties"]
    assert tiny_block["description"] == "Tiny-specific settings"


def test_engine_preflight_check_and_its_id(tiny, tmp_path: Path, capsys) -> None:
    spec = write_spec(tmp_path, "command: x\ntiny:\n  loud: true\n")
    assert main(["check", str(spec), "--on", "tiny", "--json"]) == 0
    [found] = json.loads(capsys.readouterr().out)["findings"]
    assert found["id"] == "tiny-loud" and found["where"] == f"{spec}:3"
    spec = write_spec(tmp_path, "command: x\ntiny:\n  loud: true\nignore_checks: [tiny-loud]\n")
    assert main(["check", str(spec), "--on", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []  # silenced, and a known id


def test_unknown_engine_is_bad_input_naming_the_known_ones(tiny, tmp_path, capsys) -> None:
    spec = write_spec(tmp_path, "command: x\n")
    for verb in ("run", "render", "check"):
        assert main([verb, str(spec), "--on", "nowhere"]) == 2
        err = capsys.readouterr().err
        assert err == f"treb: --on nowhere: unknown engine (known: {BUILTIN}, tiny)\n", verb


def test_an_incomplete_engine_is_refused_cleanly(tiny, tmp_path, capsys) -> None:
    backends.register("half", "trebuchet.backends.base:Backend")  # abstract methods left
    spec = write_spec(tmp_path, "command: x\n")
    assert main(["render", str(spec), "--on", "half"]) == 2
    assert "--on half: 'trebuchet.backends.base:Backend' is incomplete" in capsys.readouterr().err


def _child_env(tmp_path: Path) -> dict[str, str]:
    """sys.path with an installed `tiny-engine` distribution: module + dist-info."""
    site = tmp_path / "site"
    info = site / "tiny_engine-0.1.dist-info"
    info.mkdir(parents=True)
    shutil.copy(ENGINES / "tiny_engine.py", site)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[trebuchet.engines]\ntiny = tiny_engine:TinyEngine\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "TREB_HOME": str(tmp_path / "home")}


def test_entry_point_discovery(tmp_path: Path) -> None:
    env = _child_env(tmp_path)
    spec = write_spec(tmp_path, "name: ep\ncommand: 'true'\ntiny:\n  greeting: from ep\n")

    def treb(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                              text=True, env=env, timeout=60)  # fmt: skip

    res = treb("render", str(spec), "--on", "tiny")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "# tiny engine: ep\necho 'from ep'\ntrue\n"
    res = treb("run", str(spec), "--on", "nowhere")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr == f"treb: --on nowhere: unknown engine (known: {BUILTIN}, tiny)\n"
    # Without the distribution, the tiny block is an unknown field like any other.
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    res = treb("render", str(spec))
    assert res.returncode == 2 and f"{spec}:3: tiny: unknown field" in res.stderr


def test_listing_engines_imports_no_engine_module(tmp_path: Path) -> None:
    probe = (
        "import json, sys\nfrom trebuchet.backends import names\nnames()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trebuchet.backends.')"
        " or m in ('pydantic', 'tiny_engine'))))\n"
        "print(json.dumps(names()))"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=_child_env(tmp_path), check=True)  # fmt: skip
    modules, listed = (json.loads(x) for x in res.stdout.splitlines())
    assert modules == ["trebuchet.backends.base"]
    assert listed == ["local", "slurm", "skypilot", "ssh", "kubernetes", "tiny"]


def test_run_help_lists_every_engine_without_importing_them(tmp_path: Path) -> None:
    """`treb run --help` names the engines, an installed one too; no engine module loads,
    and parsing a command line (no help printed) does not even read the registry."""
    probe = (
        "import contextlib, io, json, sys\nfrom trebuchet.cli.main import build_parser\n"
        "build_parser().parse_args(['run', 'x.yaml'])\n"
        "before = sorted(m for m in sys.modules if m.startswith('trebuchet.backends'))\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    build_parser().parse_args(['run', '--help'])\n"
        "after = sorted(m for m in sys.modules if m.startswith('trebuchet.backends.')\n"
        "               or m == 'tiny_engine')\n"
        "print(json.dumps([before, after, ' '.join(out.getvalue().split())]))"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=_child_env(tmp_path), check=True)  # fmt: skip
    before, after, text = json.loads(res.stdout)
    assert before == [] and after == ["trebuchet.backends.base"]
    assert "engine: local | slurm | skypilot | ssh | kubernetes | tiny (default: local)" in text


@pytest.mark.parametrize("verb", ["status", "cancel"])
def test_status_and_cancel_help_name_every_kind_of_reference(verb: str, capsys) -> None:
    from trebuchet.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "RUN | SWEEP" in text and "unique prefix or name (its latest run), or a sweep id" in text
