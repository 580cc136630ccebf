"""`treb render --on local` output, checked against golden files (UPDATE_GOLDEN=1 rewrites)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import needs
from trebuchet.cli.main import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SPEC = """\
name: render-me
command: python train.py --lr ${LR:-0.1} "$RANK"
nodes: 2
procs_per_node: 2
master_port: 29511
secrets: [HF_TOKEN]
env:
  OMP_NUM_THREADS: 3
  QUOTED: "it's a $value; rm -rf /"
  FROM_SECRET: ${HF_TOKEN}
"""


@pytest.mark.parametrize("launcher", ["native", "torchrun", "none"])
def test_render_matches_golden(
    launcher, tmp_path: Path, treb_home: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_super_secret_value")
    work = tmp_path / "work"
    work.mkdir()
    spec = work / "job.yaml"
    spec.write_text(SPEC)
    assert main(["render", str(spec), "-o", f"launcher={launcher}"]) == 0
    out = capsys.readouterr().out
    assert "hf_super_secret_value" not in out
    normal = out.replace(str(treb_home), "$TREB_HOME").replace(str(work), "$WORKDIR")
    normal = normal.replace(sys.executable, "$PYTHON")
    normal = re.sub(r"treb-runtime-\d+-[0-9a-f]{12}\.pyz", "treb-runtime-VERSION-HASH.pyz", normal)
    golden = GOLDEN / f"render-local-{launcher}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()


def test_schema_is_valid_json_schema_and_accepts_examples(capsys) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["additionalProperties"] is False
    assert "nodes" in schema["properties"] and "command" in schema["required"]
    jsonschema = needs("jsonschema")
    import yaml

    for spec in Path(__file__).resolve().parents[2].glob("examples/*/job.yaml"):
        jsonschema.validate(yaml.safe_load(spec.read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"command": "x", "nodez": 1}, schema)


def test_the_local_job_file_is_json_and_the_one_description(
    tmp_path: Path, treb_home: Path, monkeypatch
) -> None:
    """The local engine's job.json is plain JSON (it reads back the same), and the job
    controller's settings come from it as on every engine, for every launcher, with hooks
    and GPUs per node."""
    from trebuchet.backends.local.engine import LocalBackend
    from trebuchet.launcher.plan import Placement
    from trebuchet.runtime.job.life import settings
    from trebuchet.spec.load import load_spec

    monkeypatch.setenv("HF_TOKEN", "x")
    (tmp_path / "job.yaml").write_text(SPEC + "pre: echo pre\npost: echo post\ntimeout: 1h\n")
    for launcher in ("native", "torchrun", "none"):
        loaded = load_spec(tmp_path / "job.yaml", [f"launcher={launcher}", "retries=2"])
        engine = LocalBackend()
        engine._placements[id(loaded)] = Placement(
            vendor="nvidia", node_gpus=[["0", "1"], ["2", "3"]]
        )
        job = engine.job_file(loaded, "RUN", tmp_path / "run")
        assert json.loads(json.dumps(job)) == job
        assert job["plan"]["hooks"] and len(job["plan"]["procs"]) >= 2
        s = settings(job)
        assert (s.retries, s.timeout, s.run_dir) == (2, 3600.0, str(tmp_path / "run"))


def test_one_spec_gives_the_job_controller_the_same_settings_on_every_engine(
    tmp_path: Path, treb_home: Path
) -> None:
    """local, ssh and Slurm hand their job controllers one job file (contracts.JobFile)
    read by one settings(): the same timeout, retries, grace (1.5 s, not rounded up to 2 on
    Slurm as before), policies and exit-code rules; only where the warning and the hang
    watch run differs (ssh's agents hold them)."""
    from trebuchet.backends.local.engine import LocalBackend
    from trebuchet.backends.slurm.script import job_file
    from trebuchet.backends.ssh.engine import ssh_job
    from trebuchet.runtime.job.life import settings
    from trebuchet.spec.load import load_spec

    (tmp_path / "job.yaml").write_text(
        "command: x\ntimeout: 1h\ntimeout_warning: 60s\nhang_timeout: 5m\ngrace_period: 1.5s\n"
        "retries: 2\nno_retry_exit_codes: [7]\n"
    )
    loaded = load_spec(tmp_path / "job.yaml")
    run = tmp_path / "run"
    jobs = {
        "local": LocalBackend().job_file(loaded, "R", run),
        "ssh": ssh_job(loaded.spec, "R", run),
        "slurm": job_file(loaded.spec, tmp_path, "R", run),
    }
    got = {engine: settings(job) for engine, job in jobs.items()}
    for engine, s in got.items():
        same = (s.timeout, s.retries, s.grace, s.run_dir, list(s.no_retry_exit_codes))
        assert same == (3600.0, 2, 1.5, str(run), [7]), engine
        assert s.log_policies == got["local"].log_policies, engine
    assert (got["slurm"].warning, got["slurm"].hang_timeout) == (60.0, 300.0)
    assert (got["local"].warning, got["local"].hang_timeout) == (60.0, 300.0)
    assert (got["ssh"].warning, got["ssh"].hang_timeout) == (None, None)
