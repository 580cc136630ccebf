"""Runs that wait for runs (`treb run B.yaml --after RUN[:ok|:any]`, docs/cli.md).

Why here, in store/: what a dependency means is read from the run index alone, whatever
engine runs either side. The waiting side is the local or ssh supervisor, polling the index
(launcher/waiting.py), or Slurm itself between two Slurm jobs (`--dependency`).
"""

from __future__ import annotations

import os
from typing import Any

from trebuchet.errors import UserError
from trebuchet.runtime.rundir.records import read_json, write_json
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.states import SUCCEEDED, TERMINAL

FILE = "after.json"
WHENS = ("ok", "any")
MAX_DEPS = 64

Dep = dict[str, Any]  # {"run", "name", "when", "backend", "job"}


def parse(store: Store, values: list[str]) -> list[Dep]:
    """`--after` values (repeated, or comma lists) -> the runs waited for."""
    deps: dict[str, Dep] = {}
    for value in values:
        for item in value.split(","):
            ref, _, when = item.strip().partition(":")
            when = when or "ok"
            if when not in WHENS:
                raise UserError(f"--after {item.strip()}: the condition must be :ok or :any, "
                                f"got :{when}")  # fmt: skip
            if not ref:
                raise UserError(f"--after {value!r}: name a run (an id, a prefix or a name)")
            rec = store.resolve(ref)
            deps[rec.id] = dep_of(rec, when)
    if len(deps) > MAX_DEPS:
        raise UserError(f"--after: at most {MAX_DEPS} runs, got {len(deps)}")
    return list(deps.values())


def dep_of(rec: RunRecord, when: str) -> Dep:
    return {"run": rec.id, "name": rec.name, "when": when, "backend": rec.backend,
            "job": rec.backend_id}  # fmt: skip


def write(run_dir: str | os.PathLike[str], deps: list[Dep]) -> None:
    write_json(os.path.join(run_dir, FILE), deps)


def read(run_dir: str | os.PathLike[str]) -> list[Dep]:
    got = read_json(os.path.join(run_dir, FILE))
    return [d for d in got if isinstance(d, dict) and d.get("run")] if isinstance(got, list) else []


def phrase(deps: list[Dep]) -> str:
    """'run 1a2b3c4d (prep) to succeed, run 5e6f7a8b (eval) to end'."""
    goal = {"ok": "to succeed", "any": "to end"}
    return ", ".join(f"run {d['run']} ({d.get('name')}) {goal.get(str(d.get('when')), 'to end')}"
                     for d in deps)  # fmt: skip


def waiting(deps: list[Dep]) -> dict[str, Any]:
    """The index's `waiting` value while B waits (store/states.describe_waiting says it)."""
    return {"reason": "after " + " ".join(d["run"] for d in deps),
            "meaning": "waiting for " + phrase(deps), "source": "treb", "starts": True}  # fmt: skip


def verdict(store: Store, deps: list[Dep]) -> tuple[bool, str | None]:
    """(every dependency ended as asked, why one never can: `dependency RUN failed`)."""
    ready = True
    for d in deps:
        rec = store.get(d["run"])
        if rec is None:
            return False, f"dependency {d['run']} is gone from the run index"
        if rec.state not in TERMINAL:
            ready = False
        elif d.get("when", "ok") == "ok" and rec.state != SUCCEEDED:
            word = "failed" if rec.state == "FAILED" else f"failed ({rec.state})"
            return False, f"dependency {d['run']} {word}"
    return ready, None
