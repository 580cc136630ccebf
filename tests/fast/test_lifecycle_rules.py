"""The job's life decided once (runtime/job/life.py): what follows an attempt and the clock
of one attempt, for the local supervisor, the ssh supervisor and Slurm's controller alike.

Why these tests: the three used to carry their own retry rule and timeout clock, and they
had drifted apart (a per-attempt timeout that Slurm did not enforce; log policies Slurm
skipped after a pre/post failure). Each branch of the one rule is pinned here in
milliseconds; the same outcomes on the real engines are in the integration tests
(test_lifecycle.py, test_ssh_runs.py, test_slurm_runs.py, test_slurm_policies.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trebuchet.runtime.contracts import schema as states
from trebuchet.runtime.job import life as lifecycle
from trebuchet.runtime.job.life import END, REQUEUE, RETRY, AttemptClock, next_step
from trebuchet.runtime.watch import log_policies as policies

PORT = {"name": "port_in_use", "pattern": "Address already in use", "action": "retry",
        "max_retries": 2}  # fmt: skip
OOM = {"name": "oom", "pattern": "CUDA out of memory", "action": "no_retry"}


def log(tmp_path: Path, text: str) -> list[Path]:
    path = tmp_path / "rank-0.log"
    path.write_text(text + "\n")
    return [path]


@pytest.mark.parametrize("state", ["SUCCEEDED", "CANCELLED", "LOST"])
def test_a_final_state_ends_the_run(state: str, tmp_path: Path) -> None:
    assert next_step(state, 0, 5, [PORT], log(tmp_path, "x"), {}).action == END


def test_a_cancel_is_never_retried(tmp_path: Path) -> None:
    got = next_step("FAILED", 0, 5, [PORT], log(tmp_path, "x"), {}, cancelled=True)
    assert got.action == END


def test_a_plain_failure_uses_the_retries(tmp_path: Path) -> None:
    logs = log(tmp_path, "Traceback: boom")
    assert next_step("FAILED", 0, 1, [PORT, OOM], logs, {}).action == RETRY
    assert next_step("FAILED", 1, 1, [PORT, OOM], logs, {}).action == END
    assert next_step("FAILED", 0, 0, [PORT, OOM], logs, {}).action == END


def test_a_retry_policy_grants_attempts_beyond_retries_up_to_its_max(tmp_path: Path) -> None:
    logs = log(tmp_path, "RuntimeError: Address already in use")
    granted: dict[str, int] = {}
    first = next_step("FAILED", 0, 0, [PORT], logs, granted)
    assert (first.action, first.verdict, first.policy) == (RETRY, policies.RETRY, PORT)
    assert "Address already in use" in first.line and granted == {"port_in_use": 1}
    assert next_step("FAILED", 1, 0, [PORT], logs, granted).action == RETRY
    exhausted = next_step("FAILED", 2, 0, [PORT], logs, granted)  # max_retries 2: used up
    assert (exhausted.action, exhausted.verdict) == (END, policies.EXHAUSTED)
    assert granted == {"port_in_use": 2}
    assert lifecycle.max_attempts(0, granted) == 3


def test_granted_attempts_do_not_use_up_the_retries(tmp_path: Path) -> None:
    """Attempt 2 after two granted ones is still the first of the spec's retries."""
    logs = log(tmp_path, "Traceback: boom")
    assert next_step("FAILED", 2, 1, [PORT], logs, {"port_in_use": 2}).action == RETRY


def test_a_no_retry_policy_ends_the_run_whatever_retries_remain(tmp_path: Path) -> None:
    got = next_step("FAILED", 0, 5, [OOM], log(tmp_path, "CUDA out of memory"), {})
    assert (got.action, got.verdict, got.policy) == (END, policies.FINAL, OOM)


def test_a_timeout_is_retried_by_retries_alone_and_policies_are_not_read(tmp_path: Path) -> None:
    logs = log(tmp_path, "CUDA out of memory")  # a no_retry line: not read after a timeout
    got = next_step("TIMEOUT", 0, 1, [OOM], logs, {})
    assert (got.action, got.policy) == (RETRY, None)
    assert next_step("TIMEOUT", 1, 1, [OOM], logs, {}).action == END


def test_near_the_engines_own_limit_a_timeout_is_requeued_and_a_failure_ends(
    tmp_path: Path,
) -> None:
    logs = log(tmp_path, "RuntimeError: Address already in use")
    assert next_step("TIMEOUT", 0, 1, [PORT], logs, {}, limit_near=True).action == REQUEUE
    assert next_step("TIMEOUT", 1, 1, [PORT], logs, {}, limit_near=True).action == END
    granted: dict[str, int] = {}
    got = next_step("FAILED", 0, 1, [PORT], logs, granted, limit_near=True)
    assert (got.action, got.policy, granted) == (END, None, {})  # no grant spent on it


@pytest.mark.parametrize(("on_hang", "attempt", "want"), [
    ("retry", 0, RETRY), ("retry", 1, END), ("fail", 0, END),
])  # fmt: skip
def test_a_hung_attempt_follows_on_hang(on_hang: str, attempt: int, want: str,
                                        tmp_path: Path) -> None:  # fmt: skip
    logs = log(tmp_path, "RuntimeError: Address already in use")  # a hang is not a failure
    assert next_step("FAILED", attempt, 1, [PORT], logs, {}, on_hang=on_hang).action == want


def test_an_end_is_final_and_the_index_keeps_it(tmp_path: Path) -> None:
    """Active states move among themselves (an engine may queue a running job again) and
    to an end; an end never moves. The run index refuses such a write, whoever asks."""
    from trebuchet.store.db import RunRecord, Store

    assert states.allowed("PENDING", "RUNNING") and states.allowed("RUNNING", "RETRYING")
    assert states.allowed("RETRYING", "RUNNING") and states.allowed("RUNNING", "PENDING")
    assert states.allowed("RUNNING", "FAILED") and states.allowed("FAILED", "FAILED")
    for end in states.TERMINAL:
        assert not any(states.allowed(end, s) for s in states.ACTIVE + states.TERMINAL
                       if s != end)  # fmt: skip
    store = Store(tmp_path / "runs.db")
    rec = RunRecord(id="r0000001", name="x", backend="local", launcher="native",
                    state="PENDING", nodes=1, procs_per_node=1, run_dir=str(tmp_path),
                    created_at=time.time())  # fmt: skip
    store.insert_run(rec)
    assert store.write_state(rec.id, state="RUNNING")
    assert store.write_state(rec.id, state="SUCCEEDED", exit_code=0)
    assert not store.write_state(rec.id, state="RUNNING", exit_code=9)  # refused, whole
    got = store.get(rec.id)
    assert got is not None and (got.state, got.exit_code) == ("SUCCEEDED", 0)
    store.close()


def test_the_clock_warns_once_then_expires_once() -> None:
    clock = AttemptClock(100.0, timeout=4.0, warning=1.0)
    assert not clock.warn_due(102.9) and not clock.expired(102.9)
    assert clock.wait(0.2, at=102.9) == pytest.approx(0.1)  # the warning is due sooner
    assert clock.warn_due(103.0) and not clock.warn_due(103.5)
    assert clock.wait(0.2, at=103.9) == pytest.approx(0.1)  # then the timeout
    assert not clock.expired(103.99) and clock.expired(104.0) and not clock.expired(105.0)
    assert clock.wait(0.2, at=105.0) == 0.2  # nothing left to wait for


def test_a_clock_without_timeout_never_fires() -> None:
    clock = AttemptClock(0.0, timeout=None, warning=None)
    assert not clock.warn_due(1e9) and not clock.expired(1e9) and clock.wait(0.2, 1e9) == 0.2
