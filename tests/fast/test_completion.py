"""Shell completion: the bash script, loaded in a real bash, completes verbs, flags, flag
values and run ids (from the store, through `treb ps -q`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import needs_program
from trebuchet.store.db import RunRecord, Store

REPO = Path(__file__).resolve().parents[2]  # this checkout, wherever the shell's cwd is


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    """TREB_HOME with two runs, and a `treb` on PATH that is this checkout."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "treb"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m trebuchet "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "TREB_HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}  # fmt: skip
    os.environ["TREB_HOME"], saved = str(home), os.environ.get("TREB_HOME")
    try:
        store = Store()
        for rid, name in (("c0ffee01", "digits"), ("c0ffee02", "gpt")):
            store.insert_run(RunRecord(id=rid, name=name, backend="local", launcher="native",
                                       state="FAILED", nodes=1, procs_per_node=1,
                                       run_dir=f"/x/{rid}", created_at=time.time()))  # fmt: skip
    finally:
        os.environ.pop("TREB_HOME") if saved is None else os.environ.update(TREB_HOME=saved)
    return env


def complete(env: dict[str, str], line: str, cwd: Path | None = None) -> list[str]:
    """What Tab offers at the end of `line` (COMP_WORDS as bash splits it)."""
    words = line.split(" ")
    script = (
        'eval "$(treb completion bash)"\n'
        "complete -p treb >/dev/null || exit 9\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_treb; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         cwd=cwd, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return sorted(w for w in res.stdout.splitlines() if w)


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash")
def test_bash_completes_verbs_flags_values_and_run_ids(shell_env, tmp_path: Path) -> None:
    assert complete(shell_env, "treb re") == ["render", "rerun", "results"]
    assert complete(shell_env, "treb ps --st") == ["--state"]
    assert "--resume-from" in complete(shell_env, "treb run --")
    assert complete(shell_env, "treb ps --state fa") == ["failed"]
    assert complete(shell_env, "treb run job.yaml --on sl") == ["slurm"]
    assert complete(shell_env, "treb status ") == ["c0ffee01", "c0ffee02"]
    assert complete(shell_env, "treb rm c0ffee01 c0ffee0") == ["c0ffee01", "c0ffee02"]
    assert complete(shell_env, "treb run x.yaml --resume-from c0ffee02") == ["c0ffee02"]
    assert complete(shell_env, "treb import sb") == ["sbatch"]
    (tmp_path / "job.yaml").write_text("command: 'true'\n")
    assert complete(shell_env, "treb run jo", cwd=tmp_path) == ["job.yaml"]
    assert complete(shell_env, "treb import sbatch jo", cwd=tmp_path) == ["job.yaml"]
    assert complete(shell_env, "treb completion z") == ["zsh"]


def test_zsh_and_fish_scripts_name_every_verb(shell_env) -> None:
    for shell in ("zsh", "fish"):
        res = subprocess.run(["treb", "completion", shell], capture_output=True, text=True,
                             env=shell_env, timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stderr
        for verb in ("rerun", "rm", "prune", "completion", "--resume-from"):
            assert verb.lstrip("-") in res.stdout
        assert "treb ps -q --all --no-refresh" in res.stdout


def test_run_id_query_imports_nothing_heavy(shell_env) -> None:
    probe = (
        "import sys\nfrom trebuchet.cli.main import main\n"
        "main(['ps', '-q', '--all', '--no-refresh'])\n"
        "heavy = [m for m in ('pydantic', 'rich', 'yaml', 'torch', 'trebuchet.backends')"
        " if m in sys.modules]\nprint('HEAVY', heavy)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=shell_env, timeout=60)  # fmt: skip
    assert res.stdout.split("HEAVY")[-1].strip() == "[]", res.stdout + res.stderr
    assert "c0ffee01" in res.stdout


def test_fish_completes_verbs_values_and_run_ids(shell_env, tmp_path: Path) -> None:
    needs_program("fish")  # scripts/system-deps installs it; CI fails without it
    script = (
        "treb completion fish | source\n"
        "for line in 'treb sta' 'treb status ' 'treb ps --state fa' 'treb run x --resume-from '\n"
        '    echo "== $line"; complete -C "$line"\nend\n'
    )
    res = subprocess.run(["fish", "-c", script], capture_output=True, text=True, env=shell_env,
                         cwd=tmp_path, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = {}
    for block in res.stdout.split("== ")[1:]:
        head, *words = block.splitlines()
        got[head] = sorted(w.split("\t")[0] for w in words)
    assert got["treb sta"] == ["stacks", "status"]
    assert got["treb status "] == ["c0ffee01", "c0ffee02"]
    assert got["treb ps --state fa"] == ["failed"]
    assert got["treb run x --resume-from "] == ["c0ffee01", "c0ffee02"]


def test_zsh_loads_the_script_and_registers_treb(shell_env, tmp_path: Path) -> None:
    needs_program("zsh")
    script = (
        'eval "$(treb completion zsh)"\ncomplete -p | grep -q "_treb treb" || exit 9\n'
        "setopt ksharrays\nCOMP_WORDS=(treb status ''); COMP_CWORD=2; _treb\n"
        'print -l -- "${COMPREPLY[@]}"\n'
    )
    res = subprocess.run(["zsh", "-c", script], capture_output=True, text=True,
                         env={**shell_env, "HOME": str(tmp_path)}, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == ["c0ffee01", "c0ffee02"]
