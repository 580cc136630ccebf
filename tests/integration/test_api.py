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
    assert err.value.rank == 1 and err.value.exit_code == 7


def test_run_failed_carries_the_error_line(treb_home: Path) -> None:
    """The failing rank's own error, not only its exit code: a caller can act on it."""
    cmd = 'python3 -c \'import os; os.environ["RANK"] == "1" and {}["lr_schedule"]\''
    run = trebuchet.launch({"name": "api-error", "command": cmd, "procs_per_node": 2})
    with pytest.raises(trebuchet.RunFailed) as err:
        run.wait(timeout=60)
    e = err.value
    assert e.error.startswith("KeyError: 'lr_schedule'"), e.error
    assert e.rank == 1 and e.exit_code == 1 and e.cause == "python_exception"
    assert e.log.endswith("attempt-0/rank-1.log")
    assert str(e).endswith(f": {e.error}") and "rank 1" in str(e)


def test_bad_spec_raises_spec_error(treb_home: Path) -> None:
    from trebuchet.errors import SpecError

    with pytest.raises(SpecError, match="nodes: must be an integer between 1 and 100000"):
        trebuchet.launch({"command": "x", "nodes": 0})


def test_cancel_from_the_api(treb_home: Path) -> None:
    run = trebuchet.launch({"name": "api-cancel", "command": "sleep 60"})
    run.cancel()
    assert run.state == "CANCELLED"
    with pytest.raises(trebuchet.RunFailed):
        run.wait(timeout=5)


def test_launch_returns_the_warnings(treb_home: Path, tmp_path: Path, caplog) -> None:
    """What `treb run` prints as warnings is on the Run (and logged), not lost."""
    import os

    repo = tmp_path / "repo"
    spec = write_spec(repo, "command: 'true'\ntimeout: 20s\n")
    (repo / "fifo").mkdir()
    os.mkfifo(repo / "fifo" / "pipe")  # a FIFO is left out of the snapshot, with a warning
    with caplog.at_level("WARNING", logger="trebuchet"):
        run = trebuchet.launch(spec)
    assert run.wait(timeout=60).state == "SUCCEEDED"
    preflight, snapshot = run.warnings
    assert preflight.startswith(f"{spec}:2: warning: ") and "[time-limit-short]" in preflight
    assert snapshot.startswith("warning: 1 file(s) left out of the code snapshot: fifo/pipe")
    assert [r.getMessage() for r in caplog.records] == run.warnings
    assert trebuchet.Run(run.id).warnings == []  # a handle made from an id says nothing


def test_launch_refuses_a_sweep_and_keeps_commas(treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo $LR'\nsweep:\n  env.LR: [1, 2]\n")
    from trebuchet.errors import UserError

    with pytest.raises(UserError, match=r"job.yaml:2: sweep: launch\(\)"):
        trebuchet.launch(spec)
    run = trebuchet.launch(spec, overrides=["sweep=null", "env.LR=1,2"])
    assert run.wait(timeout=60).logs() == "1,2\n"
