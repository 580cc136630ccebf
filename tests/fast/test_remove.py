"""Removing runs: the space counted, and nothing outside runs/ touched."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from trebuchet.errors import UserError
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir
from trebuchet.store.remove import disk_used, remove_run, run_path


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("TREB_HOME", str(tmp_path / "home"))
    return Store()


def _record(store: Store, rid: str) -> None:
    store.insert_run(RunRecord(id=rid, name="x", backend="local", launcher="native",
                               state="FAILED", nodes=1, procs_per_node=1,
                               run_dir=str(runs_dir() / rid), created_at=time.time()))  # fmt: skip
    store.set_attempt(rid, 0, state="FAILED")


def test_hard_links_count_only_when_the_last_one_goes(store: Store, tmp_path: Path) -> None:
    run = runs_dir() / "abcd0001"
    run.mkdir()
    (run / "big").write_bytes(b"x" * 65536)
    shared = tmp_path / "cache.pyz"
    shared.write_bytes(b"y" * 65536)
    os.link(shared, run / "runtime.pyz")  # also linked from outside: frees nothing
    os.link(run / "big", run / "big2")  # both links inside: counted once
    used = disk_used(run)
    assert 65536 <= used < 2 * 65536


def test_a_symlinked_run_dir_is_unlinked_not_followed(store: Store, tmp_path: Path) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "data").write_text("keep")
    _record(store, "abcd0002")
    (runs_dir() / "abcd0002").symlink_to(outside)
    remove_run(store, "abcd0002")
    assert (outside / "data").read_text() == "keep"
    assert not (runs_dir() / "abcd0002").exists() and store.get("abcd0002") is None
    assert store.attempts("abcd0002") == []


@pytest.mark.parametrize("rid", ["../etc", "..", "", "ABCD/..", "a/b", "abc\x00d"])
def test_ids_that_are_not_run_ids_never_become_paths(store: Store, rid: str) -> None:
    with pytest.raises(UserError, match="not a run id"):
        run_path(rid)
