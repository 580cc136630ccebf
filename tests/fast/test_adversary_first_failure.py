"""The adversary's second pass on the first failure (issue 33, High 5: the first failure of
an attempt, once recorded, is final; every rule reads it). The record lies in the attempt's
folder, which a rank reaches (its TORCHELASTIC_ERROR_FILE is there): a rank that wrote a
`first-failure` of its own before failing made the run's end summary, `treb status` and
`treb diagnose` end in a traceback (KeyError, ValueError, OverflowError from SQLite). What is
read back is checked field by field; one that is no record at all is not the first failure
(the controller's own is, and `no_retry_exit_codes` holds). A well-formed lie (another
label, no exit code) is the rank's to tell, as its exit status is: it may be retried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TrebFn, write_spec
from trebuchet.runtime.rundir import records

RANK = """
import json, os, sys
adir = os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"]))
with open(os.path.join(adir, "first-failure"), "w") as fh:
    fh.write(sys.argv[1])
sys.exit(7)
"""

FORGED = [
    {"exit_code": "boom", "label": [1], "rank": {"a": 1}, "node": "x", "attempt": "z"},
    {"label": "rank 0", "rank": 0, "attempt": "z", "message": "\x1b]0;T\x07\u202e"},
    {"label": "node_lost", "exit_code": 10**30, "node": 0},
    {"label": "rank 0", "rank": 0, "exit_code": 1e999, "ended_at": "x", "local_rank": []},
]


@pytest.mark.parametrize("forged", FORGED)
def test_a_forged_first_failure_breaks_no_view(forged: dict, treb: TrebFn,
                                               tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "rank.py").write_text(RANK)
    spec = write_spec(
        tmp_path,
        "name: ff\nnodes: 1\nretries: 1\nno_retry_exit_codes: [7]\n"
        f"command: [python, rank.py, {json.dumps(json.dumps(forged))}]\n",
    )
    res = treb("run", str(spec), cwd=tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    if forged is FORGED[0]:  # no record: the controller's cause, exit 7, no_retry_exit_codes
        assert "retrying" not in res.stderr, res.stderr[-3000:]
    run_id = json.loads(treb("ps", "--all", "--json").stdout)[0]["id"]
    for view in (["status", run_id], ["status", run_id, "--json"], ["diagnose", run_id],
                 ["diagnose", run_id, "--json"], ["ps", "--all"]):  # fmt: skip
        out = treb(*view)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (view, out.stderr[-2000:])
        assert "\x1b" not in out.stdout and "\u202e" not in out.stdout, (view, out.stdout)
        if "--json" in view:
            json.loads(out.stdout)


def test_outcome_keeps_the_fields_of_their_types() -> None:
    assert records.outcome([1]) is None and records.outcome({"rank": 0}) is None
    got = records.outcome({"label": "rank 1", "rank": 1, "exit_code": True, "node": 2**40,
                           "ended_at": float("nan"), "message": "m" * 10_000, "evil": 1})  # fmt: skip
    assert got == {"label": "rank 1", "rank": 1, "message": "m" * records.TEXT_MAX,
                   "node": None, "local_rank": None, "exit_code": None, "signal": None}  # fmt: skip


FIFO_RANK = """
import os, sys
run_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])))
path = os.path.join(run_dir, sys.argv[1])
if os.path.lexists(path):
    os.unlink(path)
os.mkfifo(path)
sys.exit(1)
"""


@pytest.mark.parametrize("name", ["events.jsonl", "spec.json", "spec.yaml"])
def test_a_fifo_in_the_run_directory_holds_no_supervisor_nor_view(
    name: str, treb: TrebFn, tmp_path: Path
) -> None:
    """A rank replaced its run's events.jsonl by a FIFO: the supervisor's next event opened
    it for writing and waited forever for a reader (the run never ended; `treb run`, even
    SIGTERMed, neither); spec.json: the run's end (its tracking) read it and waited, and
    `treb results` waited on it for every run in the store. The file is made a regular one
    again; readers read regular files only."""
    (tmp_path / "rank.py").write_text(FIFO_RANK)
    spec = write_spec(tmp_path, f"name: fi\nnodes: 1\ncommand: [python, rank.py, {name}]\n")
    res = treb("run", str(spec), cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    run_id = json.loads(treb("ps", "--all", "--json").stdout)[0]["id"]
    for view in (["status", run_id], ["status", run_id, "--json"], ["diagnose", run_id],
                 ["results"], ["results", "--json"]):  # fmt: skip
        out = treb(*view, timeout=60)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (view, out.stderr)
    assert json.loads(treb("status", run_id, "--json").stdout)["state"] == "FAILED"
