"""Which run a RUN argument names (Store.resolve), through the CLI: an exact id, then a
name, then a unique id prefix; a name that is also another run's id prefix is refused
(issue 25: `treb rm 19` removed run 19dd4b21 "filler" when the user meant the run "19")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir


def _run(store: Store, rid: str, name: str, age: float = 0.0) -> None:
    (runs_dir() / rid).mkdir(parents=True)
    store.insert_run(RunRecord(id=rid, name=name, backend="local", launcher="native",
                               state="FAILED", nodes=1, procs_per_node=1,
                               run_dir=str(runs_dir() / rid),
                               created_at=time.time() - age))  # fmt: skip
    store.set_attempt(rid, 0, state="FAILED")


def treb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, timeout=60, env=os.environ.copy())  # fmt: skip


@pytest.fixture
def store() -> Store:
    return Store()


def test_a_name_that_is_another_runs_id_prefix_is_refused(store: Store) -> None:
    _run(store, "19dd4b21", "filler", age=10)
    _run(store, "a0a0a0a0", "19")
    for verb in ("rm", "status"):
        res = treb(verb, "19")
        assert res.returncode == 2, res.stdout + res.stderr
        assert "Traceback" not in res.stderr
        assert "'19' is ambiguous" in res.stderr
        assert "a0a0a0a0" in res.stderr and "19dd4b21" in res.stderr, res.stderr
    assert store.get("19dd4b21") is not None and store.get("a0a0a0a0") is not None
    # The full id says which one; then the name alone is no longer ambiguous.
    assert treb("rm", "19dd4b21").returncode == 0
    assert store.get("19dd4b21") is None and store.get("a0a0a0a0") is not None
    res = treb("status", "19", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["id"] == "a0a0a0a0"


def test_exact_id_then_name_then_unique_prefix(store: Store) -> None:
    _run(store, "b1b1b1b1", "c2c2c2c2", age=20)  # named like the other run's id
    _run(store, "c2c2c2c2", "other", age=10)
    _run(store, "d3d3d3d3", "d3")  # its own id starts with its name: not ambiguous
    assert json.loads(treb("status", "c2c2c2c2", "--json").stdout)["id"] == "c2c2c2c2"
    assert json.loads(treb("status", "d3", "--json").stdout)["id"] == "d3d3d3d3"
    assert json.loads(treb("status", "b1b", "--json").stdout)["id"] == "b1b1b1b1"
    assert store.resolve("other").id == "c2c2c2c2"
    res = treb("rm", "d3")
    assert res.returncode == 0, res.stderr
    assert store.get("d3d3d3d3") is None


def test_an_ambiguous_prefix_names_no_sweep(store: Store) -> None:
    _run(store, "e4e4e4e1", "x")
    _run(store, "e4e4e4e2", "y")
    res = treb("rm", "e4e4")
    assert res.returncode == 2 and "ambiguous" in res.stderr, res.stderr
    assert store.get("e4e4e4e1") is not None and store.get("e4e4e4e2") is not None
    assert Path(runs_dir() / "e4e4e4e1").is_dir()
