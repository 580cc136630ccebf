"""`treb ps` filters: the store's SQL filter and the CLI's flags, over a real runs.db."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trebuchet.store.db import RunFilter, RunRecord, Store

DAY = 86400.0


def _add(store: Store, rid: str, name: str, state: str, backend: str, age_s: float) -> None:
    now = time.time()
    store.insert_run(RunRecord(
        id=rid, name=name, backend=backend, launcher="native", state=state, nodes=1,
        procs_per_node=1, run_dir=f"/nowhere/{rid}", created_at=now - age_s,
        ended_at=None if state == "RUNNING" else now - age_s + 1,
    ))  # fmt: skip


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("TREB_HOME", str(tmp_path))
    s = Store()
    _add(s, "aaaa0001", "digits-ddp", "FAILED", "local", 3 * DAY)
    _add(s, "aaaa0002", "digits-ddp", "SUCCEEDED", "slurm", 60)
    _add(s, "aaaa0003", "gpt", "TIMEOUT", "slurm", 2 * 3600)
    _add(s, "aaaa0004", "digits", "LOST", "local", 40 * DAY)
    return s


def ids(runs: list[RunRecord]) -> list[str]:
    return [r.id for r in runs]


def test_store_filters_each_field_in_sql(store: Store) -> None:
    assert ids(store.list(where=RunFilter(states=["FAILED", "LOST"]))) == ["aaaa0001", "aaaa0004"]
    assert ids(store.list(where=RunFilter(name="digits-ddp"))) == ["aaaa0002", "aaaa0001"]
    assert ids(store.list(where=RunFilter(name="digits*"))) == ["aaaa0002", "aaaa0001", "aaaa0004"]
    assert ids(store.list(where=RunFilter(backend="slurm"))) == ["aaaa0002", "aaaa0003"]
    assert ids(store.list(where=RunFilter(since=time.time() - DAY))) == ["aaaa0002", "aaaa0003"]
    both = RunFilter(backend="local", ended_before=time.time() - 30 * DAY)
    assert ids(store.list(where=both)) == ["aaaa0004"]
    # An exact name is not a prefix, and % or _ are not wildcards.
    assert store.list(where=RunFilter(name="digit")) == []
    assert store.list(where=RunFilter(name="digits_ddp")) == []


def test_name_filter_uses_the_index(store: Store) -> None:
    plan = store.conn.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM runs WHERE name = ? ORDER BY created_at DESC", ("x",)
    ).fetchall()
    assert "runs_name" in str([tuple(r) for r in plan])


def ps(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", "ps", "--json", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_cli_flags_combine_and_keep_the_json_shape(store: Store) -> None:
    res = ps("digits*", "--state", "failed,lost", "--backend", "local")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == ["aaaa0001", "aaaa0004"]
    assert set(rows[0]) >= {"id", "name", "backend", "state", "shape", "created_at"}
    assert [r["id"] for r in json.loads(ps("--since", "1d").stdout)] == ["aaaa0002", "aaaa0003"]
    day = time.strftime("%Y-%m-%d", time.localtime(time.time() - 10 * DAY))
    assert [r["id"] for r in json.loads(ps("--since", day).stdout)] == [
        "aaaa0002", "aaaa0003", "aaaa0001"]  # fmt: skip
    assert [r["id"] for r in json.loads(ps("--state", "ended", "--name", "gpt").stdout)] == [
        "aaaa0003"]  # fmt: skip
    quiet = subprocess.run([sys.executable, "-m", "trebuchet", "ps", "-q", "--backend", "slurm"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert quiet.stdout.split() == ["aaaa0002", "aaaa0003"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--state", "bogus"], "--state bogus: not a state"),
        (["--since", "yesterday"], "--since yesterday: expected an age"),
        (["--since=-3d"], "--since -3d: expected an age"),
        (["one", "--name", "two"], "give the name once"),
    ],
)
def test_bad_filters_are_exit_2_without_traceback(store: Store, args: list[str], says: str) -> None:
    res = ps(*args)
    assert res.returncode == 2
    assert says in res.stderr and "Traceback" not in res.stderr


def test_an_empty_store_says_no_runs_yet_and_a_filter_says_no_match(treb) -> None:
    assert "no runs yet" in treb("ps").stdout
    assert treb("ps", "--state", "failed").stdout.strip() == "no runs match"
