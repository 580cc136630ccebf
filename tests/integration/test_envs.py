"""Real environments: a venv built from PyPI, reused, rebuilt, built once under
concurrency; conda through a stand-in executable; pre/post hooks; GPU masks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_program, status_json, write_spec

pytestmark = pytest.mark.integration
SIX = "import six, sys; print('six', six.__version__, sys.prefix)"


def _events(treb) -> list[dict]:
    run_dir = Path(status_json(treb)["run_dir"])
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


def _env_event(treb) -> dict:
    return next(e for e in _events(treb) if e["event"] == "environment_ready")


def test_venv_built_reused_and_rebuilt(treb, treb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("six==1.16.0\n")
    spec = write_spec(
        tmp_path, f'command: python -c "{SIX}"\nenvironment:\n  requirements: requirements.txt\n'
    )
    first = treb("run", str(spec))
    assert first.returncode == 0, first.stderr
    prefix = treb_home / "envs" / "job"
    assert f"six 1.16.0 {prefix}" in first.stdout  # the rank's python is the env's
    assert _env_event(treb)["reused"] is False
    second = treb("run", str(spec))
    assert second.returncode == 0 and "reused" in second.stderr
    ready = _env_event(treb)
    assert ready["reused"] is True
    print(f"warm reuse check: {ready['seconds'] * 1000:.1f} ms")  # reported, never asserted
    (tmp_path / "requirements.txt").write_text("six==1.15.0\n")
    third = treb("run", str(spec))
    assert third.returncode == 0 and "six 1.15.0" in third.stdout
    assert _env_event(treb)["reused"] is False
    manifest = json.loads((prefix / "treb-env.json").read_text())
    assert manifest["tool"] == "uv" and manifest["inputs"]["requirements_file"].endswith(
        "requirements.txt"
    )


def test_treb_build_then_run_uses_the_manifest(treb, treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        f'command: python -c "{SIX}"\nenvironment:\n  name: shared\n  requirements: [six]\n',
    )
    res = treb("build", str(spec), "--json")
    assert res.returncode == 0, res.stderr
    built = json.loads(res.stdout)
    assert built["reused"] is False and built["prefix"] == str(treb_home / "envs" / "shared")
    again = json.loads(treb("build", str(spec), "--json").stdout)
    assert again["reused"] is True and again["stamp"] == built["stamp"]
    assert treb("run", str(spec)).returncode == 0
    assert _env_event(treb)["reused"] is True


def test_concurrent_runs_build_one_env_once(treb_home: Path, tmp_path: Path, treb) -> None:
    spec = write_spec(
        tmp_path, f'command: python -c "{SIX}"\nenvironment:\n  requirements: [six]\n'
    )
    procs = [subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]  # fmt: skip
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    runs = json.loads(treb("ps", "--json").stdout)
    reused = []
    for r in runs:
        events = (Path(r["run_dir"]) / "events.jsonl").read_text().splitlines()
        reused += [json.loads(e)["reused"] for e in events if '"environment_ready"' in e]
    assert sorted(reused) == [False, True, True]  # one build; the others waited and reused it


def test_hostile_env_name_stays_in_the_cache(treb, treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "command: 'echo $VIRTUAL_ENV'\nenvironment:\n  name: '../../x y/..'\n  requirements: [six]\n",
    )
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    prefix = Path(res.stdout.split()[-1])
    assert prefix.parent == treb_home / "envs"


def test_missing_python_version_is_a_clear_error(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: x\nenvironment:\n  python: '3.2'\n")
    res = treb("run", str(spec))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "job.yaml:3: environment.python: Python 3.2 is not installed here" in res.stderr


def test_image_without_a_container_engine_is_refused(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: x\nenvironment:\n  image: alpine:3\n")
    res = treb("run", str(spec), env={"PATH": "/nonexistent"})
    assert res.returncode == 2 and "no container engine: install docker or podman" in res.stderr


FAKE_CONDA = """#!/bin/bash
# Stand-in for micromamba: no conda channel is reachable here. It records its arguments,
# "creates" a prefix whose python is this machine's, and runs commands in it.
echo "$*" >> "$FAKE_CONDA_LOG"
cmd=$1; shift
case "$cmd" in
  create) while [ $# -gt 0 ]; do [ "$1" = -p ] && prefix=$2; shift; done
          mkdir -p "$prefix/bin" && ln -sf "$REAL_PYTHON" "$prefix/bin/python" ;;
  run) [ "$1" = -p ] && shift 2; exec "$@" ;;
esac
"""


def test_conda_prefix_with_a_stand_in_micromamba(treb, treb_home: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "micromamba"
    fake.parent.mkdir()
    fake.write_text(FAKE_CONDA)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "conda-calls.log"
    (tmp_path / "setup.sh").write_text("echo setup ran\n")
    spec = write_spec(tmp_path, "command: 'echo hi from $RANK'\nenvironment:\n  conda:\n    python: '3.11'\n"
                      "  requirements: [six]\n  setup: setup.sh\n")  # fmt: skip
    env = {"PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", "FAKE_CONDA_LOG": str(log),
           "REAL_PYTHON": sys.executable}  # fmt: skip
    res = treb("run", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    prefix = treb_home / "envs" / "job"
    calls = log.read_text().splitlines()
    assert calls[0] == f"create --yes -p {prefix} python=3.11 pip"
    assert calls[1] == f"run -p {prefix} python -m pip install six"
    assert calls[2] == f"run -p {prefix} bash {tmp_path / 'setup.sh'}"
    assert calls[3] == f"run -p {prefix} bash -c echo hi from $RANK"  # the rank, wrapped
    assert "hi from 0" in res.stdout


def test_pre_and_post_run_on_each_node_and_a_failing_pre_stops_the_attempt(
    treb, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, "command: 'cat $TREB_RUN_DIR/pre-$NODE_RANK'\nnodes: 2\n"
                      "pre: 'echo ready > $TREB_RUN_DIR/pre-$NODE_RANK'\n"
                      "post: 'echo done > $TREB_RUN_DIR/post-$NODE_RANK'\n")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 0, res.stderr
    run_dir = Path(status_json(treb)["run_dir"])
    assert (run_dir / "post-0").read_text() == (run_dir / "post-1").read_text() == "done\n"
    bad = write_spec(tmp_path, "command: 'touch $TREB_RUN_DIR/ran'\npre: 'test $NODE_RANK = 0'\nnodes: 2\n",
                     name="bad.yaml")  # fmt: skip
    res = treb("run", str(bad))
    st = status_json(treb)
    assert res.returncode == 1 and st["state"] == "FAILED"
    assert st["first_failure"]["label"] == "pre:1" and not (Path(st["run_dir"]) / "ran").exists()


@pytest.mark.parametrize("launcher", ["native", "mpirun"])
def test_gpu_masks_reach_the_ranks(launcher, treb, tmp_path: Path) -> None:
    if launcher == "mpirun":
        needs_program("mpirun")
    cmd = 'echo "$NODE_RANK:$LOCAL_RANK=$CUDA_VISIBLE_DEVICES n=$TREB_NGPUS"'
    spec = write_spec(
        tmp_path, f"command: '{cmd}'\nnodes: 2\ngpus_per_node: 2\nlauncher: {launcher}\n"
    )
    env = {"TREB_FAKE_GPUS": "nvidia:4"}  # stands in for nvidia-smi: this machine has no GPU
    res = treb("run", str(spec), env=env)
    assert res.returncode == 0, res.stderr
    lines = sorted(
        line.split("] ", 1)[1] for line in res.stdout.splitlines() if ":" in line.split("] ", 1)[0]
    )
    assert lines == ["0:0=0,1 n=2", "0:1=0,1 n=2", "1:0=2,3 n=2", "1:1=2,3 n=2"]
    res = treb("run", str(spec), "-o", "gpus_per_node=3", env=env)
    assert res.returncode == 2 and "needs 6 GPU(s); 4 detected" in res.stderr
