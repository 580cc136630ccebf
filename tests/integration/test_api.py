"""The Python API: launch() returns a Run whose wait() raises when the run fails."""

from __future__ import annotations

from pathlib import Path

import pytest

import trebuchet
from tests.conftest import write_spec

pytestmark = pytest.mark.integration


def test_launch_path_with_overrides_and_wait(treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo value=$VALUE rank=$RANK'\n")
    run = trebuchet.launch(spec, overrides=["env.VALUE=42", "procs_per_node=2"])
    assert run.wait(timeout=60) is run
    assert run.state == "SUCCEEDED"
    assert run.logs(rank=1) == "value=42 rank=1\n"
    assert (run.run_dir / "spec.yaml").exists()


def test_failed_run_raises_with_the_root_cause(treb_home: Path) -> None:
    run = trebuchet.launch(
        {"name": "api-fail", "command": 'test "$RANK" != 1 || exit 7', "procs_per_node": 2}
    )
    with pytest.raises(trebuchet.RunFailed) as err:
        run.wait(timeout=60)
    assert err.value.state == "FAILED"
    assert "rank 1" in str(err.value) and "code 7" in str(err.value)


def test_bad_spec_raises_spec_error(treb_home: Path) -> None:
    from trebuchet.errors import SpecError

    with pytest.raises(SpecError, match="nodes: must be an integer >= 1"):
        trebuchet.launch({"command": "x", "nodes": 0})


def test_cancel_from_the_api(treb_home: Path) -> None:
    run = trebuchet.launch({"name": "api-cancel", "command": "sleep 60"})
    run.cancel()
    assert run.state == "CANCELLED"
    with pytest.raises(trebuchet.RunFailed):
        run.wait(timeout=5)
