"""Stragglers on real runs (docs/goodput.md#stragglers): lockstep training over gloo whose
ranks mark their arrival at each step's all-reduce. A rank slowed by 50 % is named within
20 steps (the script waits, after its 20th step, for the `straggler` event: no clock in the
test), also to a webhook; an even run of 200 fast steps names nobody. The even run also
prints the HuggingFace Trainer's checkpoint line at step 100 and fails at its end: the
line alone is the checkpoint that keeps the first half of its training (goodput)."""

# ruff: noqa: F811 (the receiver fixture of test_notify.py is named as an argument)
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, needs, status_json, write_spec
from tests.integration.test_notify import Receiver, receiver  # noqa: F401

pytestmark = pytest.mark.integration
TRAIN = REPO / "tests" / "integration" / "scripts" / "straggle_train.py"


def events(run_dir: str, kind: str) -> list[dict[str, Any]]:
    lines = (Path(run_dir) / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def slowed(treb: Callable[..., Any], tmp_path: Path, *on: str, procs: int = 2,
           nodes: int = 1, extra: str = "") -> dict[str, Any]:  # fmt: skip
    """Rank 1 of `nodes` x `procs` takes 1.5x the others' time each step, for 20 steps:
    named, in events.jsonl with its node and host, `status`, `status --json`."""
    needs("torch")
    spec = write_spec(tmp_path / "slow", f"command: [{sys.executable}, {TRAIN}, '20', '0.1', "
                      f"'1', '1.5', '1']\nnodes: {nodes}\nprocs_per_node: {procs}\n{extra}")  # fmt: skip
    res = treb("run", str(spec), *on, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "straggler named" in res.stdout + res.stderr
    st = status_json(treb)
    found = events(st["run_dir"], "straggler")
    assert [e["rank"] for e in found] == [1], found
    e = found[0]
    assert {"event", "time", "rank", "node", "host", "score"} <= set(e)
    assert e["node"] == 1 // procs and isinstance(e["host"], str) and e["host"]
    assert 1.3 <= e["score"] < 3, e
    named = st["stragglers"]["stragglers"]
    assert [(s["rank"], s["node"], s["host"]) for s in named] == [(1, e["node"], e["host"])]
    assert set(st["stragglers"]["ranks"]) == {str(r) for r in range(nodes * procs)}
    text = treb("status").stdout
    assert "straggler: rank 1 (node" in text, text
    return st


def test_slowed_rank_named_and_even_run_not(treb, tmp_path: Path, receiver: Receiver) -> None:
    hook = f"notify:\n  - url: {receiver.url}/hook\n    on: [straggler]\n"
    st = slowed(treb, tmp_path, extra=hook)
    posted = receiver.got("/hook")
    assert [(b["event"], b["rank"], b["node"]) for b in posted] == [("straggler", 1, 0)], posted
    assert posted[0]["run_id"] == st["id"] and "straggler: rank 1" in posted[0]["cause"]
    top = treb("top", "--once", "--all")
    assert "straggler: rank 1" in top.stdout, top.stdout
    # an even run: 200 steps of 20 ms on every rank, nobody named
    spec = write_spec(tmp_path / "even", f"command: [{sys.executable}, {TRAIN}, '200', "
                      "'0.02', '-1', '1', '0', '100', '1']\nprocs_per_node: 2\n")  # fmt: skip
    res = treb("run", str(spec), timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    even = status_json(treb)
    assert even["id"] != st["id"]
    assert events(even["run_dir"], "straggler") == []
    assert even["stragglers"]["stragglers"] == []
    assert set(even["stragglers"]["ranks"]) == {"0", "1"}  # both were scored
    assert all(s < 1.3 for s in even["stragglers"]["ranks"].values()), even["stragglers"]
    # the logged checkpoint: a mark numbered 100, the training up to it kept, the rest redone
    logged = (Path(even["run_dir"]) / "attempt-0" / "marks" / "rank-0.from-log").read_text()
    assert logged.split()[1:] == ["checkpoint", "100"], logged
    assert not any(Path(even["run_dir"], "checkpoints").glob("*"))  # no file said it
    g = even["goodput"]
    assert g["productive_s"] > 0 and g["lost"]["redone"] > 0, g
