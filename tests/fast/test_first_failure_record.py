"""Issue 33, high 5: an attempt's first failure is recorded once and every rule reads it:
the record is refused a second write (records.claim_first), the job controller keeps the
first cause given (JobController.settle), a node lost after it is no cause
(records.first_failure), and a process ended by a preemption is no program's exit
(retry_codes.cause_code). Real files, no mocks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.runtime.contracts.schema import FirstFailure
from trebuchet.runtime.job import retry_codes
from trebuchet.runtime.job.life import JobController, Settings
from trebuchet.runtime.rundir import records
from trebuchet.store.states import describe_failure


def rank(r: int, code: int, at: float, **more: Any) -> FirstFailure:
    rec: FirstFailure = {"label": f"rank {r}", "rank": r, "node": r, "local_rank": 0,
                         "exit_code": code, "signal": None, "ended_at": at}  # fmt: skip
    rec.update(more)  # type: ignore[typeddict-item]
    return rec


def test_the_first_claim_wins(tmp_path: Path) -> None:
    first, later = rank(0, 7, 1.0), rank(1, 1, 2.0)
    assert records.claim_first(str(tmp_path), first) == first
    assert records.claim_first(str(tmp_path), later) == first
    assert records.claimed_first(str(tmp_path)) == first
    assert [p.name for p in tmp_path.iterdir()] == [records.FIRST]  # no temp file left


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(1, 255)), min_size=1, max_size=6))
def test_whatever_comes_later_the_first_stays(tmp_path_factory: Any,
                                              causes: list[tuple[int, int]]) -> None:  # fmt: skip
    adir = tmp_path_factory.mktemp("a")
    for i, (r, code) in enumerate(causes):
        records.claim_first(str(adir), rank(r, code, float(i)))
    held = records.claimed_first(str(adir))
    assert held is not None and (held["rank"], held["exit_code"]) == causes[0]


class Said:
    """A Records that keeps what the controller recorded (lifecycle.Records)."""

    def __init__(self) -> None:
        self.causes: list[FirstFailure] = []

    def first_failure(self, cause: FirstFailure) -> None:
        self.causes.append(cause)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_the_controller_keeps_the_first_cause(tmp_path: Path) -> None:
    (tmp_path / "attempt-0").mkdir()
    s = Settings(retries=2, log_policies=[], on_hang="fail", hang_timeout=None, timeout=None,
                 warning=None, checkpoint_signal=10, grace=1.0, shape=("native", 2, 1),
                 run_dir=str(tmp_path))  # fmt: skip
    said = Said()
    job = JobController(s, nodes=None, records=said)  # type: ignore[arg-type]
    job.settle(rank(0, 7, 1.0))
    lost = records.cause("node_lost", 1, 0, node=1, message="node_lost: node-1 (gone)")
    job.settle(lost)  # a node lost during the teardown
    assert job.first_failure is not None and job.first_failure["exit_code"] == 7
    job.settle(rank(0, 7, 1.0, log="/x/rank-0.log"))  # the same failure, its log known now
    assert job.first_failure["log"] == "/x/rank-0.log" and job.first_failure["rank"] == 0
    assert [c["rank"] for c in said.causes] == [0, 0]
    on_disk = json.loads((tmp_path / "attempt-0" / records.FIRST).read_text())
    assert (on_disk["rank"], on_disk["exit_code"]) == (0, 7)


def test_a_node_lost_after_the_first_failure_is_no_cause() -> None:
    lost = records.cause("node_lost", 1, 0, node=1, message="node_lost: node-1")
    lost["ended_at"] = 0.5  # last seen before the rank's exit: still after the failure
    lost[records.AFTER] = True  # type: ignore[literal-required]
    found = records.first_failure([rank(0, 7, 1.0), lost])
    assert found is not None and found["exit_code"] == 7
    del lost[records.AFTER]  # type: ignore[misc]
    found = records.first_failure([rank(0, 7, 1.0), lost])
    assert found is not None and found["label"] == "node_lost"  # a loss first: the cause


def test_a_preempted_rank_is_no_programs_exit(tmp_path: Path) -> None:
    adir = str(tmp_path)
    term = rank(0, 143, 10.0, signal="SIGTERM")
    assert retry_codes.cause_code(term, adir) == 143
    records.write_json(os.path.join(adir, retry_codes.PREEMPTED), {"time": 9.0})
    assert retry_codes.cause_code(term, adir) is None
    assert retry_codes.cause_code(rank(0, 3, 8.0), adir) == 3  # failed before it began


def test_the_rank_that_left_first_is_named_when_the_launcher_stopped_it() -> None:
    """horovodrun under load (the records of a CI run, reproduced in
    tests/integration/test_horovod.py): rank 1 left, rank 0 failed on horovod's shutdown
    (after_peer), horovodrun stopped rank 1 in its exit. Rank 1 is named, marked left_first;
    a stopped rank with no peer's word, or two such ranks, name nobody."""
    peer = rank(0, 1, 1.48, stopped_by_launcher=True, after_peer=True)
    left = rank(1, 143, 1.57, signal="SIGTERM", stopped_by_launcher=True)
    launcher: FirstFailure = {"label": "0", "rank": None, "node": 0, "exit_code": 1}
    found = records.first_failure([peer, left, launcher])
    assert found is not None and found["rank"] == 1 and found.get("left_first")
    assert "left first" in describe_failure(found) and "SIGTERM" in describe_failure(found)
    assert records.first_failure([rank(0, 1, 1.0, stopped_by_launcher=True), left]) is None
    two = rank(2, 143, 1.6, signal="SIGTERM", stopped_by_launcher=True)
    assert records.first_failure([peer, left, two]) is None
    own = rank(2, 3, 1.9)  # a rank that failed on its own still comes first
    assert records.first_failure([peer, left, own]) == own


def test_after_peer_and_left_first_survive_the_records_check(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps(rank(0, 1, 1.0, stopped_by_launcher=True, after_peer=True)))
    assert records.outcome(records.read_json(str(path))) == rank(
        0, 1, 1.0, stopped_by_launcher=True, after_peer=True
    )
    path.write_text(json.dumps(rank(0, 1, 1.0, after_peer="yes")))
    assert "after_peer" not in (records.outcome(records.read_json(str(path))) or {})


def test_no_exit_code_rule_acts_on_the_code_of_a_rank_that_left_first(tmp_path: Path) -> None:
    """The rank that left first was stopped in its own exit: its 143 is the launcher's
    SIGTERM, its own code (sys.exit(3)) is lost. `retry_exit_codes: [3]` must not end the
    run on "exit code 143 is not in retry_exit_codes", nor `no_retry_exit_codes: [143]`
    act on it: no program said that code (as for a lost node, `retries` decide)."""
    peer = rank(0, 1, 1.48, stopped_by_launcher=True, after_peer=True)
    left = rank(1, 143, 1.57, signal="SIGTERM", stopped_by_launcher=True)
    found = records.first_failure([peer, left])
    assert found is not None and found.get("left_first")
    assert retry_codes.cause_code(found, str(tmp_path)) is None
    records.claim_first(str(tmp_path), found)  # as the controller reads it back
    assert retry_codes.cause_code(None, str(tmp_path)) is None
    for rec in (peer, left):
        records.write_json(str(tmp_path / f"rank-{rec['rank']}.json"), rec)
    os.unlink(tmp_path / records.FIRST)
    assert retry_codes.cause_code(None, str(tmp_path)) is None  # from the ranks' records


def test_no_rank_left_first_where_the_stopped_rank_ended_before_its_peers_failed() -> None:
    """A stop from outside (Ctrl+C, `treb cancel`, the timeout, the hang watch) stops
    every rank; one that horovodrun's SIGTERM reached first ends horovod for the others,
    and a peer whose own SIGTERM came later fails on that shutdown first (after_peer).
    That rank was stopped before any peer failed: it left first in no sense, and a
    cancelled or timed-out run must get no first failure invented. Only a rank stopped
    after a peer failed on its end is named."""
    peer = rank(0, 1, 2.0, stopped_by_launcher=True, after_peer=True)
    stopped_first = rank(1, 143, 1.9, signal="SIGTERM", stopped_by_launcher=True)
    assert records.first_failure([peer, stopped_first]) is None
    no_time = rank(1, 143, None, signal="SIGTERM", stopped_by_launcher=True)  # type: ignore[arg-type]
    assert records.first_failure([peer, no_time]) is None
    later = rank(1, 143, 2.1, signal="SIGTERM", stopped_by_launcher=True)
    found = records.first_failure([peer, later])
    assert found is not None and found["rank"] == 1 and found.get("left_first")


def test_a_left_first_rank_is_said_the_same_by_the_notification_and_status() -> None:
    """The webhook's cause (and the run's end line, life.py) said `rank 1 (node 1) killed
    by SIGTERM` (a stop from outside, in words) where `treb status` says it left first."""
    from trebuchet.runtime.publish.webhooks import cause_text

    peer = rank(0, 1, 1.48, stopped_by_launcher=True, after_peer=True)
    left = rank(1, 143, 1.57, signal="SIGTERM", stopped_by_launcher=True, host="tn2")
    found = records.first_failure([peer, left])
    assert found is not None
    said = cause_text(found)
    assert said.startswith("rank 1 (node 1) left first (the others failed on its end)"), said
    assert "its exit cut short (SIGTERM)" in said and said.endswith(" on tn2"), said
    assert "left first (the others failed on its end), its exit cut short (SIGTERM)" in (
        describe_failure(found)
    )


def test_diagnose_says_the_left_first_rank_in_the_same_words(tmp_path: Path) -> None:
    """`treb diagnose` of that run names rank 1 with status's words, not its own."""
    from trebuchet.diagnose.report import diagnose_run

    peer = rank(0, 1, 1.48, stopped_by_launcher=True, after_peer=True, node=0)
    left = rank(1, 143, 1.57, signal="SIGTERM", stopped_by_launcher=True, node=0)
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    for rec in (peer, left):
        records.write_json(str(adir / f"rank-{rec['rank']}.json"), rec)
        (adir / f"rank-{rec['rank']}.log").write_text("step 1\n")
    found = records.first_failure([peer, left])
    assert found is not None
    run = {"id": "ab12", "run_dir": str(tmp_path), "state": "FAILED", "attempt": 0,
           "backend": "local", "first_failure": {**found, "attempt": 0}}  # fmt: skip
    d = diagnose_run(run)
    assert d.rank == 1, d.summary
    assert "left first (the others failed on its end), its exit cut short (SIGTERM)" in (
        d.summary
    ), d.summary


def test_a_rank_cannot_say_of_itself_that_it_left_first(tmp_path: Path) -> None:
    """left_first is the reading of all the records (records.left_first), never a field a
    record brings: a rank that writes one into its own record (it runs in the attempt's
    folder) is its own failure with its own code, which the exit-code rules still read."""
    forged = rank(0, 3, 1.0, left_first=True)
    records.write_json(str(tmp_path / "rank-0.json"), forged)
    found = records.first_failure(records.attempt_records(str(tmp_path)))
    assert found is not None and found["exit_code"] == 3 and not found.get("left_first")
    assert "left first" not in describe_failure(found)
    assert retry_codes.cause_code(None, str(tmp_path)) == 3
