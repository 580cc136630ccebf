"""Which engines --resume-from accepts: those whose ranks see the run directory."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trebuchet.backends import get_backend
from trebuchet.errors import UserError
from trebuchet.launcher import resume
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import run_dir


def test_local_and_slurm_resume_skypilot_and_kubernetes_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREB_HOME", str(tmp_path))
    store = Store()
    store.insert_run(RunRecord(id="abcd0001", name="x", backend="slurm", launcher="native",
                               state="TIMEOUT", nodes=2, procs_per_node=1,
                               run_dir=str(run_dir("abcd0001")), created_at=time.time()))  # fmt: skip
    (run_dir("abcd0001") / "checkpoints").mkdir(parents=True)
    (run_dir("abcd0001") / "checkpoints" / "model.pt").write_bytes(b"w")
    for name in ("local", "slurm"):
        assert resume.source(store, "abcd", get_backend(name)) == (
            "abcd0001", run_dir("abcd0001") / "checkpoints")  # fmt: skip
    for name in ("skypilot", "kubernetes"):
        with pytest.raises(UserError, match="do not see the run directory"):
            resume.source(store, "abcd", get_backend(name))
    dest = tmp_path / "dest"
    dest.mkdir()
    resume.copy(run_dir("abcd0001") / "checkpoints", dest)
    assert (dest / "model.pt").read_bytes() == b"w"
    (dest / "model.pt").write_bytes(b"changed")
    assert (run_dir("abcd0001") / "checkpoints" / "model.pt").read_bytes() == b"w"
