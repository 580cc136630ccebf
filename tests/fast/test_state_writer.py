"""One writer of a run's state (store/lifecycle.record): each change is an event in the
run's events.jsonl first and the index follows it; a rebuilt index replays the events to
the same state; no other code writes the state columns."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from trebuchet.store import lifecycle
from trebuchet.store.db import STATE_COLUMNS, RunRecord, Store
from trebuchet.store.paths import home_path
from trebuchet.store.rebuild import rebuild

PKG = Path(__file__).resolve().parents[2] / "trebuchet"
WRITER = PKG / "store" / "lifecycle.py"


def _calls(name: str) -> list[tuple[Path, ast.Call]]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr == name:
                found.append((path, node))
    return found


def test_only_the_writer_writes_state_columns() -> None:
    """update_run is never given a state column, and write_state is called only by the
    writer (a new engine that sets states by hand fails here, with where)."""
    bad = [
        f"{p.relative_to(PKG.parent)}:{c.lineno}"
        for p, c in _calls("update_run")
        if {k.arg for k in c.keywords} & set(STATE_COLUMNS)
    ]
    bad += [f"{p.relative_to(PKG.parent)}:{c.lineno}" for p, c in _calls("write_state")
            if p not in (WRITER, PKG / "store" / "db.py")]  # fmt: skip
    assert not bad, f"state written outside store/lifecycle.record: {bad}"


def _new_run(store: Store, run_id: str) -> Path:
    run_dir = home_path() / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.yaml").write_text("name: w\ncommand: x\n")
    store.insert_run(RunRecord(
        id=run_id, name="w", backend="local", launcher="native", state="PENDING", nodes=1,
        procs_per_node=1, run_dir=str(run_dir), created_at=time.time(),
    ))  # fmt: skip
    return run_dir


def _events(run_dir: Path) -> list[str]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in lines]


def test_update_run_refuses_state() -> None:
    store = Store()
    _new_run(store, "20261202-000000-aaaa")
    with pytest.raises(ValueError, match="store/lifecycle"):
        store.update_run("20261202-000000-aaaa", state="FAILED")


def test_the_index_follows_events_and_a_rebuild_replays_them() -> None:
    store = Store()
    rid = "20261202-000000-bbbb"
    run_dir = _new_run(store, rid)
    assert lifecycle.record(store, rid, "attempt_started", only_if_active=False,
                            attempt=0)  # fmt: skip
    assert lifecycle.record(store, rid, "retrying", attempt=1)
    assert lifecycle.record(store, rid, "attempt_started", attempt=1)
    # the same state again with nothing new: no event, no write (refreshes ask often)
    assert not lifecycle.record(store, rid, "state", state="RUNNING")
    assert lifecycle.record(store, rid, "run_ended", {"exit_code": 3},
                            state="FAILED")  # fmt: skip
    # an end is final: a later state is refused, and leaves no event behind
    assert not lifecycle.record(store, rid, "state", only_if_active=False,
                                state="RUNNING")  # fmt: skip
    assert _events(run_dir) == ["attempt_started", "retrying", "attempt_started", "run_ended"]
    live = store.get(rid)
    assert live is not None and (live.state, live.attempt, live.exit_code) == ("FAILED", 1, 3)
    store.close()
    rebuild(home_path())
    again = Store().get(rid)
    assert again is not None
    assert (again.state, again.attempt, again.ended_at) == ("FAILED", 1, live.ended_at)


def test_a_lost_event_file_does_not_lose_the_index(capsys: pytest.CaptureFixture[str]) -> None:
    """The run directory cannot take the event (here: it is gone): the index still learns
    the state, and the loss is said."""
    store = Store()
    rid = "20261202-000000-cccc"
    run_dir = _new_run(store, rid)
    (run_dir / "spec.yaml").unlink()
    run_dir.rmdir()
    (run_dir.parent / rid).write_text("not a folder")  # appending under it fails (ENOTDIR)
    assert lifecycle.record(store, rid, "run_ended", state="SUCCEEDED")
    rec = store.get(rid)
    assert rec is not None and rec.state == "SUCCEEDED"
    assert "not in events.jsonl" in capsys.readouterr().err
