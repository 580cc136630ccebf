"""The resolved spec a run keeps (spec.yaml) loads again from the run directory, as
`treb rerun` loads it: environment files stay found."""

from __future__ import annotations

from pathlib import Path

from trebuchet.spec import resolved
from trebuchet.spec.load import load_spec


def test_resolved_spec_loads_from_elsewhere_with_its_environment_files(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "requirements.txt").write_text("numpy\n")
    (proj / "setup.sh").write_text("true\n")
    (proj / "job.yaml").write_text(
        "command: python t.py\nenv: {A: '1'}\n"
        "environment: {requirements: requirements.txt, setup: setup.sh}\n"
    )
    loaded = load_spec(proj / "job.yaml", ["env.A=2"])
    run = tmp_path / "runs" / "abcd1234"
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(resolved.text(loaded))
    again = load_spec(run / "spec.yaml", ["nodes=2"])
    assert again.spec.env == {"A": "2"} and again.spec.nodes == 2
    assert again.workdir == proj
    assert Path(again.spec.environment.requirements) == proj / "requirements.txt"
    assert Path(again.spec.environment.setup) == proj / "setup.sh"
