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


def test_plan_json_is_asdict(tmp_path: Path, treb_home: Path, monkeypatch) -> None:
    """Plan.to_json skips asdict's deep copy (launch speed): the same data, and it reads back
    as the same plan, for every launcher, with hooks and GPUs per node."""
    from trebuchet.launcher.plan import Placement, Plan, local_plan
    from trebuchet.plain import asdict
    from trebuchet.spec.load import load_spec

    monkeypatch.setenv("HF_TOKEN", "x")
    (tmp_path / "job.yaml").write_text(SPEC + "pre: echo pre\npost: echo post\n")
    for launcher in ("native", "torchrun", "none"):
        loaded = load_spec(tmp_path / "job.yaml", [f"launcher={launcher}"])
        place = Placement(vendor="nvidia", node_gpus=[["0", "1"], ["2", "3"]])
        plan = local_plan(loaded.spec, tmp_path, "RUN", tmp_path / "run", dict(os.environ), place)
        data = plan.to_json()
        assert data == asdict(plan)
        assert json.loads(json.dumps(data)) == data
        assert Plan.from_json(json.loads(json.dumps(data))) == plan
        assert plan.hooks and len(plan.procs) >= 2
