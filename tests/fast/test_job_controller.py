"""The one job controller (runtime/lifecycle.JobController) with a fake engine: every branch
of the attempt loop and the watch loop in milliseconds.

The fake stands in for an engine's node agents only (what the local Agent, the ssh sessions
and Slurm's srun steps do for real in tests/integration); the controller under test is the
code all three engines run. Each attempt is scripted: how long its processes run, whether
one fails on its own (and what its log says), whether pre/post fail.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from trebuchet.runtime.job.life import Ending, JobController, Settings

PORT = {"name": "port_in_use", "pattern": "Address already in use", "action": "retry",
        "max_retries": 1}  # fmt: skip
OOM = {"name": "oom", "pattern": "CUDA out of memory", "action": "no_retry"}
USR2 = int(signal.SIGUSR2)


class Script:
    """One attempt as the fake engine plays it."""

    def __init__(self, runs: float = 0.0, fails: str | None = None, pre: bool = True,
                 post: bool = True, hung: bool = False, handles_warning: bool = True,
                 engine_ends: bool = False, limit_near: bool = False) -> None:  # fmt: skip
        self.runs, self.fails, self.pre, self.post = runs, fails, pre, post
        self.hung, self.handles_warning, self.engine_ends = hung, handles_warning, engine_ends
        self.limit_near = limit_near


class FakeEngine:
    """Nodes and Records at once; it keeps what the controller asked and recorded."""

    def __init__(self, tmp: Path, scripts: list[Script]) -> None:
        self.tmp, self.scripts = tmp, scripts
        self.calls: list[str] = []
        self.records: list[tuple[Any, ...]] = []
        self.job: JobController | None = None
        self.end_at = 0.0
        self.stopped = False
        self.script = scripts[0]

    # -- Nodes
    def prepare(self) -> dict[str, Any] | None:
        return None

    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        self.script = self.scripts[min(attempt, len(self.scripts) - 1)]  # this attempt's
        return {"master_port": 29500 + attempt}

    def pre_post(self, when: str, attempt: int) -> bool:
        self.calls.append(f"{when}:{attempt}")
        return self.script.pre if when == "pre" else self.script.post

    def start(self, attempt: int) -> None:
        self.calls.append(f"start:{attempt}")
        self.end_at, self.stopped = time.monotonic() + self.script.runs, False
        (self.tmp / f"attempt-{attempt}").mkdir(exist_ok=True)
        if self.script.fails is not None:
            log = self.tmp / f"attempt-{attempt}" / "rank-1.log"
            log.write_text(self.script.fails + "\n")
            assert self.job is not None
            self.job.failure({"label": "0:1", "rank": 1, "exit_code": 3, "log": str(log)})

    def poll(self) -> bool:
        return not self.stopped and time.monotonic() < self.end_at

    def checkpoint(self, signum: int) -> int:
        self.calls.append(f"checkpoint:{signal.Signals(signum).name}")
        return 1 if self.script.handles_warning else 0

    def stop(self) -> None:
        self.calls.append("stop")
        self.stopped = True

    def kill(self) -> None:
        self.calls.append("kill")
        self.stopped = True

    def tick(self) -> None:
        pass

    def after(self, attempt: int, reason: str | None) -> None:
        self.calls.append(f"after:{attempt}:{reason}")

    def ending(self, attempt: int, reason: str | None) -> Ending:
        s = self.script
        states = {"cancel": "CANCELLED", "timeout": "TIMEOUT", "failure": "FAILED",
                  "post": "FAILED", "hang": "FAILED"}  # fmt: skip
        state = states.get(reason, "SUCCEEDED")
        if s.hung:
            state, reason = "FAILED", "hang"
        end = Ending(state, reason, hung=s.hung, limit_near=s.limit_near,
                     engine_ended=s.engine_ends)  # fmt: skip
        return end

    def logs(self, attempt: int, cause: dict[str, Any] | None) -> list[str]:
        return [str(p) for p in sorted((self.tmp / f"attempt-{attempt}").glob("*.log"))]

    def exit_code(self) -> int:
        return 0

    def requeue(self) -> None:
        self.calls.append("requeue")

    # -- Records
    def say(self, text: str) -> None:
        self.records.append(("say", text))

    def event(self, kind: str, **fields: Any) -> None:
        self.records.append(("event", kind))

    def attempt_started(self, attempt: int, started_at: float, **facts: Any) -> None:
        self.records.append(("started", attempt, facts))

    def attempt_stopped(self, attempt: int, state: str, reason: str) -> None:
        self.records.append(("stopped", attempt, state, reason))

    def attempt_ended(self, attempt: int, state: str, reason: str | None) -> None:
        self.records.append(("ended", attempt, state, reason))

    def first_failure(self, cause: dict[str, Any]) -> None:
        self.records.append(("first_failure", cause["rank"], cause["attempt"]))

    def hang(self, attempt: int, info: dict[str, Any], action: str) -> None:
        self.records.append(("hang", attempt, action))

    def log_policy(self, attempt: int, name: str, action: str, line: str) -> None:
        self.records.append(("policy", attempt, name, action))

    def max_attempts(self, count: int, granted: dict[str, int]) -> None:
        self.records.append(("max_attempts", count))

    def retrying(self, attempt: int) -> None:
        self.records.append(("retrying", attempt))

    def run_ended(
        self, state: str, cause: dict[str, Any] | None, exit_code: int, reason: str | None = None
    ) -> None:
        self.records.append(("run_ended", state, exit_code))

    def heartbeat(self) -> None:
        pass


def run(tmp_path: Path, scripts: list[Script], retries: int = 0, timeout: float | None = None,
        warning: float | None = None, policies: list[dict[str, Any]] | None = None,
        on_hang: str = "fail", cancel_after: float | None = None) -> tuple[str, FakeEngine]:  # fmt: skip
    engine = FakeEngine(tmp_path, scripts)
    settings = Settings(retries=retries, log_policies=policies or [], on_hang=on_hang,
                        hang_timeout=None, timeout=timeout, warning=warning,
                        checkpoint_signal=USR2, grace=0.01, shape=("native", 1, 1),
                        run_dir=str(tmp_path))  # fmt: skip
    job = JobController(settings, engine, engine)
    engine.job = job
    if cancel_after is not None:
        orig = engine.poll

        def poll() -> bool:
            if time.monotonic() > engine.end_at - engine.script.runs + cancel_after:
                job.cancel(int(signal.SIGINT))
            return orig()

        engine.poll = poll  # type: ignore[method-assign]
    return job.run(), engine


def states(engine: FakeEngine) -> list[tuple[Any, ...]]:
    return [r for r in engine.records if r[0] in ("ended", "stopped", "run_ended")]


def test_a_run_that_succeeds(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script()])
    assert state == "SUCCEEDED"
    assert states(e) == [("ended", 0, "SUCCEEDED", None), ("run_ended", "SUCCEEDED", 0)]
    assert e.calls == ["pre:0", "start:0", "after:0:None", "post:0"]
    assert e.records[0] == ("started", 0, {"master_port": 29500})


def test_a_failure_is_the_root_cause_stops_the_nodes_and_is_retried_once(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(runs=5, fails="Traceback: boom")], retries=1)
    assert state == "FAILED"
    assert states(e) == [("ended", 0, "FAILED", "failure"), ("ended", 1, "FAILED", "failure"),
                         ("run_ended", "FAILED", 3)]  # fmt: skip
    assert ("first_failure", 1, 0) in e.records and ("first_failure", 1, 1) in e.records
    assert e.calls.count("stop") == 2 and ("retrying", 1) in e.records


def test_a_log_policy_grants_an_attempt_beyond_retries(tmp_path: Path) -> None:
    scripts = [Script(runs=5, fails="OSError: Address already in use"), Script()]
    state, e = run(tmp_path, scripts, retries=0, policies=[PORT])
    assert state == "SUCCEEDED"
    assert ("policy", 0, "port_in_use", "retry") in e.records
    assert ("max_attempts", 2) in e.records


def test_a_no_retry_policy_ends_the_run(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(runs=5, fails="CUDA out of memory")], retries=3,
                   policies=[OOM])  # fmt: skip
    assert state == "FAILED" and len([r for r in e.records if r[0] == "ended"]) == 1
    assert ("policy", 0, "oom", "no_retry") in e.records


def test_a_failing_pre_ends_the_attempt_before_the_ranks_start(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(pre=False), Script()], retries=1)
    assert state == "SUCCEEDED"
    assert states(e)[0] == ("stopped", 0, "FAILED", "pre")
    assert "start:0" not in e.calls and "start:1" in e.calls


def test_a_failing_post_fails_a_good_attempt(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(post=False)])
    assert state == "FAILED" and states(e)[0] == ("ended", 0, "FAILED", "post")


def test_the_timeout_warns_then_stops_and_a_timeout_is_retried(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(runs=30)], retries=1, timeout=0.15, warning=0.1)
    assert state == "TIMEOUT"
    assert [r for r in e.records if r[0] == "ended"] == [
        ("ended", 0, "TIMEOUT", "timeout"), ("ended", 1, "TIMEOUT", "timeout")]  # fmt: skip
    assert e.calls.count("checkpoint:SIGUSR2") == 2 and e.calls.count("stop") == 2
    assert e.calls.index("checkpoint:SIGUSR2") < e.calls.index("stop")


def test_a_warning_no_rank_handles_is_said(tmp_path: Path) -> None:
    _, e = run(tmp_path, [Script(runs=30, handles_warning=False)], timeout=0.1, warning=0.05)
    assert any(r[0] == "say" and "no rank handles SIGUSR2" in r[1] for r in e.records)


def test_a_rank_that_dies_of_the_warning_ends_the_attempt_as_a_timeout(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [Script(runs=30)])
    settings = Settings(
        0, [], "fail", None, 10.0, 9.95, USR2, 0.01, ("native", 1, 1), str(tmp_path)
    )
    job = JobController(settings, engine, engine)
    orig = engine.checkpoint

    def checkpoint(signum: int) -> int:  # the rank dies of it: its agent asks the controller
        assert job.stopped_by_warning(-USR2)
        return orig(signum)

    engine.checkpoint = checkpoint  # type: ignore[method-assign]
    assert not job.stopped_by_warning(-USR2)  # before the warning it would be a failure
    assert job.run() == "TIMEOUT"


def test_cancel_stops_the_attempt_and_is_never_retried(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(runs=30)], retries=5, cancel_after=0.05)
    assert state == "CANCELLED" and "stop" in e.calls
    assert states(e) == [("ended", 0, "CANCELLED", "cancel"), ("run_ended", "CANCELLED", 0)]


def test_a_cancel_after_a_failure_cancels_the_pending_retry(tmp_path: Path) -> None:
    """The cancel comes while a failed attempt stops (its post runs): no retry starts and
    the run is CANCELLED (not FAILED, not "nothing failed"), its cause the failed attempt's."""
    engine = FakeEngine(tmp_path, [Script(runs=5, fails="boom"), Script()])
    settings = Settings(1, [], "fail", None, None, None, USR2, 0.01, ("native", 1, 1),
                        str(tmp_path))  # fmt: skip
    job = engine.job = JobController(settings, engine, engine)
    post = engine.pre_post

    def pre_post(when: str, attempt: int) -> bool:  # Ctrl+C while attempt 0's post runs
        if when == "post":
            job.cancel(int(signal.SIGINT))
        return post(when, attempt)

    engine.pre_post = pre_post  # type: ignore[method-assign]
    assert job.run() == "CANCELLED"
    assert "start:1" not in engine.calls and ("retrying", 1) not in engine.records
    assert states(engine) == [("ended", 0, "FAILED", "failure"), ("run_ended", "CANCELLED", 3)]
    said = [r[1] for r in engine.records if r[0] == "say"]
    assert said == ["attempt 1 FAILED (rank 1 exited with code 3); its retry (attempt 2) cancelled"]


@pytest.mark.parametrize(("on_hang", "attempts"), [("retry", 2), ("fail", 1)])
def test_a_hang_the_nodes_found_follows_on_hang(on_hang: str, attempts: int,
                                                tmp_path: Path) -> None:  # fmt: skip
    state, e = run(tmp_path, [Script(hung=True)], retries=1, on_hang=on_hang)
    assert state == "FAILED"
    assert len([r for r in e.records if r[0] == "ended"]) == attempts


def test_an_engine_that_ends_the_job_gets_no_record_and_no_next_attempt(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(engine_ends=True)], retries=3)
    assert [r for r in e.records if r[0] == "ended"] == []
    assert "start:1" not in e.calls


def test_near_the_engines_own_limit_a_timeout_is_requeued(tmp_path: Path) -> None:
    state, e = run(tmp_path, [Script(runs=30, limit_near=True)], retries=1, timeout=0.05,
                   warning=0.01)  # fmt: skip
    assert state == "TIMEOUT" and "requeue" in e.calls and "start:1" not in e.calls


def test_a_jump_of_the_wall_clock_does_not_end_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock jumps 2 h forward while `pre` runs (NTP, a VM resumed): the attempt's
    timeout counts on the monotonic clock, so a 0.05 s attempt under a 5 s timeout succeeds
    (it ended TIMEOUT at once when the timeout started from the wall clock's start)."""
    engine_pre = FakeEngine.pre_post
    real = time.time

    def pre_post(self: FakeEngine, when: str, attempt: int) -> bool:
        monkeypatch.setattr(time, "time", lambda: real() + 7200)
        return engine_pre(self, when, attempt)

    monkeypatch.setattr(FakeEngine, "pre_post", pre_post)
    state, e = run(tmp_path, [Script(runs=0.05)], timeout=5.0, warning=1.0)
    assert state == "SUCCEEDED" and "checkpoint:SIGUSR2" not in e.calls


def test_ranks_that_ended_while_the_controller_was_stopped_are_not_a_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's process is stopped (SIGSTOP, a laptop's suspend) past the timeout
    while the ranks end well: when it runs again, their end is what counts, not its clock
    (it recorded TIMEOUT)."""
    real_poll = FakeEngine.poll

    def poll(self: FakeEngine) -> bool:
        if real_poll(self):
            time.sleep(0.3)  # stopped here, past the timeout; the ranks end meanwhile
        return real_poll(self)

    monkeypatch.setattr(FakeEngine, "poll", poll)
    state, e = run(tmp_path, [Script(runs=0.05)], timeout=0.2)
    assert state == "SUCCEEDED" and "stop" not in e.calls
