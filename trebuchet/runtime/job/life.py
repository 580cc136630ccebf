"""The job's life above its node agents, decided once for every engine: what follows an
attempt (retry here, requeue, or the end) and the clock of one attempt. Each engine drives
its own processes and records, but asks this module, so that the same spec and the same
outcome mean the same next step everywhere.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Protocol, Sequence

from ..contracts import schema as contracts
from ..rundir.records import claim_first
from ..watch import log_policies as policies
from .retry_codes import cause_code
from .retry_codes import verdict as retry_codes_verdict

if TYPE_CHECKING:
    from os import PathLike

    from ..contracts.schema import FirstFailure, Hang, LogPolicy
    from ..publish.webhooks import Notifier

# What follows an attempt
RETRY = "retry"  # another attempt, here and now
REQUEUE = "requeue"  # another attempt in a new allocation (the engine's own limit is near)
END = "end"  # the run ends with this attempt's state
EXIT_CODE = "exit_code"  # a Decision's verdict: the exit-code rules ended the run
NO_PROGRESS = "no_progress"  # a Decision's verdict: attempts in a row kept no work
NO_PROGRESS_DEFAULT = 3  # the spec's max_attempts_without_progress (NVIDIA's launcher's)


class Decision(NamedTuple):
    action: str  # RETRY, REQUEUE or END
    verdict: str  # policies.NO_MATCH, RETRY, FINAL or EXHAUSTED
    policy: LogPolicy | None
    line: str


def next_step(
    state: str,
    attempt: int,
    retries: int,
    log_policies: list[LogPolicy],
    logs: Iterable[str | PathLike[str]],
    granted: dict[str, int],
    *,
    on_hang: str | None = None,
    cancelled: bool = False,
    limit_near: bool = False,
    matcher: policies.Matcher | None = None,
    exit_code: int | None = None,
    no_retry_codes: Sequence[int] = (),
    retry_codes: Sequence[int] | None = None,
    no_progress: int = 0,
    max_no_progress: int = 0,
) -> Decision:
    """After attempt `attempt` (from 0) ended `state`, the one rule:

    - a cancel, a success or a lost run ends it;
    - `no_progress` attempts in a row that kept no work end it at `max_no_progress`,
      however many retries remain;
    - `retries` count the attempts no retry policy granted (`granted`, kept by the caller);
    - a hung attempt is retried only under on_hang: retry;
    - a timed-out one by `retries` alone: in a new allocation when the engine's own limit
      is near (Slurm's warning), else here;
    - a failed one: the exit-code rules (retry_codes.py), then the first matching log
      policy, then `retries`; with the engine's limit near, none."""
    if cancelled or state not in contracts.RETRIABLE:
        return Decision(END, policies.NO_MATCH, None, "")
    if max_no_progress and no_progress >= max_no_progress:
        line = (f"{no_progress} attempts in a row kept no work (no checkpoint past the last "
                f"one): max_attempts_without_progress is {max_no_progress}")  # fmt: skip
        return Decision(END, NO_PROGRESS, {"name": NO_PROGRESS, "action": "no_retry"}, line)
    normal_left = attempt - sum(granted.values()) < retries
    if on_hang is not None:
        go = on_hang == "retry" and normal_left
        return Decision(RETRY if go else END, policies.NO_MATCH, None, "")
    if state == "TIMEOUT":
        again = REQUEUE if limit_near else RETRY
        return Decision(again if normal_left else END, policies.NO_MATCH, None, "")
    if limit_near:  # the ranks failed as the allocation ends: no policy, no retry here
        return Decision(END, policies.NO_MATCH, None, "")
    by_code = retry_codes_verdict(exit_code, no_retry_codes, retry_codes)
    if by_code is not None:
        return Decision(END, EXIT_CODE, {"name": by_code[0], "action": "no_retry"}, by_code[1])
    verdict, policy, line = policies.decide(log_policies, logs, granted, matcher)
    if verdict == policies.RETRY or (verdict != policies.FINAL and normal_left):
        return Decision(RETRY, verdict, policy, line)
    return Decision(END, verdict, policy, line)


def max_attempts(retries: int, granted: dict[str, int]) -> int:
    return retries + 1 + sum(granted.values())


class AttemptClock:
    """The spec's `timeout` of one attempt, monotonic, counted from its start (before `pre`),
    and its warning; each is due once."""

    def __init__(self, started: float, timeout: float | None, warning: float | None) -> None:
        self.timeout_at = started + float(timeout) if timeout else None
        warn = self.timeout_at - float(warning) if self.timeout_at and warning else None
        self.warn_at = warn
        due = (("warn", self.warn_at), ("expire", self.timeout_at))
        self._pending = {name: at for name, at in due if at is not None}  # not yet fired

    def _fire(self, name: str, at: float | None) -> bool:
        when = self._pending.get(name)
        if when is None or (time.monotonic() if at is None else at) < when:
            return False
        del self._pending[name]
        return True

    def warn_due(self, at: float | None = None) -> bool:
        return self._fire("warn", at)

    def expired(self, at: float | None = None) -> bool:
        return self._fire("expire", at)

    def wait(self, cap: float, at: float | None = None) -> float:
        at = time.monotonic() if at is None else at
        return max(0.0, min([cap, *(when - at for when in self._pending.values())]))


# The attempt loop and the watch loop are the same job's life whatever starts the
# processes: an engine gives the controller its Nodes and its Records; the controller decides.


class Settings(NamedTuple):
    retries: int
    log_policies: list[LogPolicy]
    on_hang: str
    hang_timeout: float | None  # None: no hang watch here (or the nodes watch themselves)
    timeout: float | None  # None: no timeout here (or the nodes hold it themselves)
    warning: float | None
    checkpoint_signal: int
    grace: float
    shape: tuple[str, int, int]  # launcher, nodes, ranks per node: the hang watch's names
    run_dir: str
    no_retry_exit_codes: Sequence[int] = ()  # runtime/job/retry_codes.py
    retry_exit_codes: Sequence[int] | None = None


def settings(job: contracts.JobFile) -> Settings:
    """Where the node agents watch for hangs and send the warning (`nodes_watch`: ssh), the
    controller holds the timeout alone, from the attempt's start (a late agent counts)."""
    here = not job.get("nodes_watch")
    hung = job.get("hang_timeout") if here else None
    return Settings(
        retries=int(job.get("max_attempts", 1)) - 1, log_policies=job.get("policies", []),
        on_hang=job.get("on_hang") or "fail", hang_timeout=float(hung) if hung else None,
        timeout=job.get("timeout"), warning=job.get("warning") if here else None,
        checkpoint_signal=int(getattr(signal, job["checkpoint_signal"])),
        grace=float(job["grace"]), shape=(job["launcher"], int(job["nodes"]), int(job["ppn"])),
        run_dir=job["run_dir"], no_retry_exit_codes=job.get("no_retry_exit_codes", []),
        retry_exit_codes=job.get("retry_exit_codes"),
    )  # fmt: skip


class Ending(NamedTuple):
    state: str
    reason: str | None
    hung: bool = False  # the nodes' own hang watch stopped it (engines whose nodes watch)
    limit_near: bool = False  # the engine's own time limit is near (Slurm's warning)
    engine_ended: bool = False  # the engine is ending the job: no record, no next attempt
    final: bool = False  # no next attempt can help (a lost node and no spare): the run ends


class Nodes(Protocol):
    """An engine's side of an attempt: its node agents (in this process, over ssh, ...)."""

    def prepare(self) -> FirstFailure | None:
        """Before the first attempt; the cause of a failure that ends the run, or None."""

    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        """What attempt_started records beside the attempt (its master port, ...)."""

    def pre_post(self, when: str, attempt: int) -> bool:
        """The spec's pre/post command on every node; False when one failed."""

    def start(self, attempt: int) -> None: ...

    def poll(self) -> bool:
        """One step: reap, act on the nodes' own news; True while a process runs."""

    def checkpoint(self, signum: int) -> int:
        """`signum` to the ranks that handle it; how many got it."""

    def stop(self) -> None:
        """End the attempt: SIGTERM, the grace period, SIGKILL (idempotent)."""

    def kill(self) -> None:
        """End the attempt now (a second cancel)."""

    def tick(self) -> None:
        """Per loop step, the engine's own upkeep (adopted orphans, host messages)."""

    def after(self, attempt: int, reason: str | None) -> None:
        """Once every process ended, before `post` (strays killed, logs fetched)."""

    def ending(self, attempt: int, reason: str | None) -> Ending:
        """`reason`: why the controller stopped it, if it did."""

    def logs(self, attempt: int, cause: FirstFailure | None) -> list[str]:
        """The logs the log policies read after a failed attempt, the failing one's first."""

    def exit_code(self) -> int: ...

    def requeue(self) -> None:
        """The next attempt in a new allocation (only asked when an Ending said limit_near)."""


class Records(Protocol):
    """Where a run's state goes (the run index and events.jsonl; Slurm: the run's files)."""

    def say(self, text: str) -> None: ...
    def event(self, kind: str, **fields: Any) -> None: ...
    def attempt_started(self, attempt: int, started_at: float, **facts: Any) -> None: ...
    def attempt_stopped(self, attempt: int, state: str, reason: str) -> None: ...
    def attempt_ended(self, attempt: int, state: str, reason: str | None) -> None: ...
    def first_failure(self, cause: FirstFailure) -> None: ...
    def hang(self, attempt: int, info: Hang, action: str) -> None: ...
    def log_policy(self, attempt: int, name: str, action: str, line: str) -> None: ...
    def max_attempts(self, count: int, granted: dict[str, int]) -> None: ...
    def retrying(self, attempt: int) -> None: ...
    def run_ended(
        self, state: str, cause: FirstFailure | None, exit_code: int, reason: str | None = None
    ) -> None: ...
    def heartbeat(self) -> None: ...


HEARTBEAT_S = 5.0


class JobController:
    def __init__(
        self,
        settings: Settings,
        nodes: Nodes,
        records: Records,
        granted: dict[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.records = records
        self.attempt = 0
        self.cancel_signal: int | None = None  # the signal that cancelled the run
        self.force_kill = False  # a second cancel: no more grace
        self.first_failure: FirstFailure | None = None  # this attempt's root cause
        self.failed = False  # a process failed on its own (its cause may come later)
        self.stopping = False  # the controller stopped this attempt (stop)
        self.hang: Hang | None = None  # this attempt's hang, when it stops it
        self.idle_stop = False  # idle_gpu_action fail stopped this attempt (runtime/watch/gpu.py)
        self.hang_stop_at: float | None = None  # on_hang retry: the teardown, after grace
        self.warned = False  # the timeout's warning was sent in this attempt
        self.warned_stop = False  # a rank died of the checkpoint signal after it
        self.granted = dict(granted or {})  # retries the log policies granted, by name
        self.ending = Ending("FAILED", None)  # the last attempt's
        self.started_at = 0.0  # the attempt's start, wall time (the no-progress rule's)
        # the attempt whose retry is pending or running: (attempt, state, reason, its cause);
        # a cancel before the retry's ranks start ends the run as cancelled after it
        self.retry_of: tuple[int, str, str | None, FirstFailure | None] | None = None
        self.unstarted = False  # this attempt ended (a cancel) before its ranks started
        spec = spec_of(settings.run_dir)
        limit = spec.get("max_attempts_without_progress", NO_PROGRESS_DEFAULT)
        self.max_no_progress = limit if type(limit) is int and limit >= 0 else 0
        self.no_progress = no_progress_count(settings.run_dir)  # kept across a requeue
        # the log policies' search, started while an attempt runs (off a retry's path)
        self.matcher = policies.Matcher() if settings.log_policies else None
        self.notifier = notifier(settings.run_dir)  # the spec's webhooks, or None
        self.wake_r, self.wake_w = os.pipe()  # signal handlers' wake-up (set_wakeup_fd)
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def cancel(self, signum: int) -> None:
        if self.cancel_signal is not None:
            self.force_kill = True
        self.cancel_signal = signum

    def failure(self, cause: FirstFailure | None, stop: bool = True) -> None:
        """The attempt's first process to fail on its own (its record may come later: None).
        `stop=False`: a pre/post command, every node's runs to its end."""
        if self.failed:
            return
        self.failed = True
        if cause is not None:
            self.settle(cause)
        if stop:
            self.stop()

    def settle(self, cause: FirstFailure) -> FirstFailure:
        """The one place that records the attempt's first failure: the first cause wins,
        here and in the attempt's folder (even over another process). A later cause only
        fills in what was missing of the same failure (its log, fetched later)."""
        held = self.first_failure
        if held is None:
            mine: FirstFailure = {**cause, "attempt": self.attempt}
            held = claim_first(self.attempt_dir(self.attempt), mine)
        elif same_failure(held, cause) and set(cause) - set(held):
            held = {**cause, **held}
        else:
            return held
        self.first_failure = held
        self.records.first_failure(held)
        return held

    def stopped_by_warning(self, returncode: int | None) -> bool:
        """After the warning, a rank that died of the checkpoint signal is part of the
        timeout, not a failure."""
        if self.warned and returncode == -self.settings.checkpoint_signal:
            self.warned_stop = True
            return True
        return False

    @property
    def settled(self) -> bool:
        """Failing or being stopped: a node lost from now on is no cause (nodeloss `after`)."""
        return self.failed or self.stopping or self.hang is not None

    def stop(self) -> None:
        self.stopping = True
        self.nodes.stop()
        self.records.event("teardown", attempt=self.attempt)

    def run(self, first: int = 0) -> str:
        """Every attempt from `first` (a requeued job's restart), then the run's end."""
        try:
            return self._run(first)
        finally:
            if self.matcher is not None:
                self.matcher.close()
            if self.notifier is not None:  # the run's end waited for it; else (an error) not
                self.notifier.close(wait=0.0)

    def _run(self, first: int) -> str:
        state = "FAILED"
        reason: str | None = None
        cause = self.nodes.prepare()
        if cause is None:
            attempt = first
            while True:
                state = self.run_attempt(attempt)
                if state == "CANCELLED" and self.unstarted and self.retry_of is not None:
                    state, reason = self.retry_cancelled(*self.retry_of)  # during the gap
                    break
                action = self.next_action(state, attempt)
                if action != END and self.cancel_signal is not None:  # the retry: cancelled
                    self.retry_of = (attempt, state, self.ending.reason, self.first_failure)
                    state, reason = self.retry_cancelled(*self.retry_of)
                    break
                if action == REQUEUE:
                    self.nodes.requeue()  # returns only when the engine refused it
                if action != RETRY:
                    break
                self.records.say(
                    f"attempt {attempt + 1} {state}; retrying as attempt {attempt + 2}"
                )
                self.records.retrying(attempt + 1)
                self.retry_of = (attempt, state, self.ending.reason, self.first_failure)
                attempt += 1
            cause = self.first_failure
            if reason is not None and self.retry_of is not None:
                cause = self.retry_of[3]  # the failed attempt's: the run's root cause
        code = cause.get("exit_code") if cause else None
        if code is None:
            code = self.nodes.exit_code()
        self.records.run_ended(state, cause, code, reason)
        if self.notifier is not None:  # the webhooks, once the state is recorded; bounded
            from ..publish.webhooks import cause_text

            why = cause_text(cause) or (self.ending.reason or "")
            self.notifier.event(state.lower(), state, why, exit_code=code)
            self.notifier.close()
        return state

    def retry_cancelled(
        self, attempt: int, state: str, why: str | None, cause: FirstFailure | None
    ) -> tuple[str, str]:
        """A cancel before a pending retry's ranks started: the run ends CANCELLED, saying
        that an attempt did fail (its cause stays the run's)."""
        from ..publish.webhooks import cause_text

        said = cause_text(cause) or ("" if why in (None, "failure") else why)
        what = f"attempt {attempt + 1} {state}" + (f" ({said})" if said else "")
        reason = f"cancelled after {what}, before its retry started"
        self.records.say(f"{what}; its retry (attempt {attempt + 2}) cancelled")
        self.records.event("retry_cancelled", attempt=attempt, state=state)
        return "CANCELLED", reason

    def next_action(self, state: str, attempt: int) -> str:
        cause, s = self.first_failure, self.settings
        code = None
        if state == "FAILED":  # the rules apply to every run: 126/127 (retry_codes.py)
            code = cause_code(cause, self.attempt_dir(attempt))
        if state in contracts.RETRIABLE and self.max_no_progress:
            self.count_progress(attempt)
        decision = next_step(
            state, attempt, self.settings.retries, self.settings.log_policies,
            self.nodes.logs(attempt, cause) if state == "FAILED" else [], self.granted,
            on_hang=self.settings.on_hang if self.hang is not None else None,
            # a cancel: a cancelled attempt is CANCELLED, never retried; one that failed
            # before the cancel is decided as it would be (the caller cancels its retry)
            cancelled=self.ending.engine_ended or self.ending.final or self.idle_stop,
            limit_near=self.ending.limit_near, matcher=self.matcher, exit_code=code,
            no_retry_codes=s.no_retry_exit_codes, retry_codes=s.retry_exit_codes,
            no_progress=self.no_progress, max_no_progress=self.max_no_progress,
        )  # fmt: skip
        if decision.verdict == NO_PROGRESS:
            self.records.event(NO_PROGRESS, attempt=attempt, attempts=self.no_progress,
                               limit=self.max_no_progress)  # fmt: skip
        if decision.policy is not None:
            name, action = decision.policy["name"], decision.policy["action"]
            self.records.log_policy(attempt, name, action, decision.line)
        if decision.verdict == policies.RETRY:
            count = max_attempts(self.settings.retries, self.granted)
            self.records.max_attempts(count, self.granted)
        return decision.action

    def run_attempt(self, attempt: int) -> str:
        self.attempt = attempt
        self.first_failure, self.failed, self.hang, self.hang_stop_at = None, False, None, None
        self.idle_stop = self.stopping = False
        self.warned = self.warned_stop = False
        started, clock_start = time.time(), time.monotonic()  # the record's; the timeout's
        self.started_at = started
        self.unstarted = False
        self.records.attempt_started(attempt, started, **self.nodes.attempt_facts(attempt))
        if self.notifier is not None:
            if attempt == 0:
                self.notifier.event("started", "RUNNING", attempt=0)
            self.notifier.attempt(attempt, self.attempt_dir(attempt))
        self.ending = Ending("FAILED", "pre")
        pre_ok = self.cancel_signal is None and self.nodes.pre_post("pre", attempt)
        if self.cancel_signal is not None:  # before the ranks start: none starts
            self.unstarted = True
            why = "cancelled before its ranks started"
            if self.retry_of is not None:
                n = self.retry_of[0] + 1
                why = f"cancelled after attempt {n} failed, before its ranks started"
            self.ending = Ending("CANCELLED", why)
            self.records.attempt_stopped(attempt, "CANCELLED", why)
            return "CANCELLED"
        if not pre_ok:
            self.records.attempt_stopped(attempt, "FAILED", "pre")
            return "FAILED"
        self.nodes.start(attempt)
        reason = self.watch(attempt, started, clock_start)
        if self.notifier is not None:
            self.notifier.end_attempt()
        self.nodes.after(attempt, reason)
        if not self.nodes.pre_post("post", attempt) and reason is None:
            reason = "post"
        end = self.ending = self.nodes.ending(attempt, reason)
        if end.hung:
            self.hang = {}  # the nodes' own hang watch stopped it (their hang.json says it)
            if self.notifier is not None:  # known here only now (ssh: the hosts watch)
                self.notifier.event("hung", "RUNNING", end.reason or "hang", attempt=attempt)
        if not end.engine_ended:
            self.records.attempt_ended(attempt, end.state, end.reason)
        return end.state

    def watch(self, attempt: int, started: float, clock_start: float) -> str | None:
        """Why the controller stopped the attempt, if it did. The timeout is monotonic: a
        jump of the wall clock neither ends nor stretches it."""
        s = self.settings
        reason: str | None = "failure" if self.failed else None
        clock = AttemptClock(clock_start, s.timeout, s.warning)
        from ..watch.gpu import idle_watch
        from ..watch.straggler import watch as straggler_watch

        watch = None
        idle = idle_watch(s.run_dir, self.attempt_dir(attempt), started)  # None unless asked
        strag = straggler_watch(s.run_dir, self.attempt_dir(attempt), s.shape[2],
                                s.shape[1] * s.shape[2])  # fmt: skip
        if s.hang_timeout:
            from ..watch.hung import HangWatch, expected_names

            names = expected_names(*s.shape)
            watch = HangWatch(self.attempt_dir(attempt), s.hang_timeout, s.on_hang, names,
                              started)  # fmt: skip
        beat = time.monotonic() + HEARTBEAT_S
        while True:
            alive = self.nodes.poll()
            if not alive:  # all ended: their records say how (a clock read now, e.g. after
                self.nodes.tick()  # this process was stopped, would call them a timeout)
                if strag is not None:  # the last steps, however short the attempt
                    strag.step(self.records, attempt, self.notifier, force=True)
                if reason is None and (self.failed or self.cancel_signal is not None):
                    reason = "failure" if self.failed else "cancel"
                return reason
            if reason is None and idle is not None and idle.step(self.records, attempt):
                reason, self.idle_stop = "idle_gpu", True
                self.stop()
            if reason is None and strag is not None:
                strag.step(self.records, attempt, self.notifier)
            if reason is None and watch is not None:
                found = watch.step()
                if found is not None and self.on_hang(attempt, found):
                    reason = "hang"
            if reason is None and self.failed:
                reason = "failure"
            if reason is None and self.warned_stop:  # a rank did not handle the warning
                reason = "timeout"
                self.stop()
            if reason is None and self.cancel_signal is not None:
                reason = "cancel"
                self.stop()
            if reason is None and clock.warn_due():
                self.warned = True
                sent = self.nodes.checkpoint(s.checkpoint_signal)
                self.records.event("timeout_warning", attempt=attempt, delivered=sent,
                                   signal=signal_name(s.checkpoint_signal))  # fmt: skip
                if not sent:
                    self.records.say(f"timeout near: no rank handles "
                                     f"{signal_name(s.checkpoint_signal)}, so none was sent; "
                                     "the ranks run on to the timeout")  # fmt: skip
            if reason is None and clock.expired():
                reason = "timeout"
                self.stop()
            if self.hang_stop_at is not None and time.monotonic() >= self.hang_stop_at:
                self.hang_stop_at = None
                self.stop()
            if self.force_kill:
                self.nodes.kill()
            self.nodes.tick()
            if time.monotonic() >= beat:
                beat = time.monotonic() + HEARTBEAT_S
                self.records.heartbeat()
            if self.matcher is not None and self.failed:
                # The log policies' matcher starts at the first failure, during the
                # teardown (its interpreter would cost a healthy run ~12 MiB throughout).
                self.matcher.start()
            select.select([self.wake_r], [], [], 0.2 if reason else clock.wait(0.2))
            self.drain()

    def on_hang(self, attempt: int, info: Hang) -> bool:
        """on_hang retry sends the checkpoint signal and gives the handlers the grace period
        before the teardown. True when it stops the attempt."""
        action = self.settings.on_hang
        self.records.event("hang", attempt=attempt, action=action,
                           last_progress=info["last_progress"], detected_at=info["detected_at"],
                           stacks=len(info["stacks"]))  # fmt: skip
        self.records.hang(attempt, info, action)
        if self.notifier is not None:
            from ..watch.hung import describe

            self.notifier.event("hung", "RUNNING", describe(info), attempt=attempt,
                                action=action)  # fmt: skip
        if action == "warn":
            return False
        self.hang = info
        if action == "retry":
            self.warned = True  # a rank the checkpoint signal ends was stopped by it
            if self.nodes.checkpoint(self.settings.checkpoint_signal):
                self.hang_stop_at = time.monotonic() + self.settings.grace
                return True
        self.stop()
        return True

    def attempt_dir(self, attempt: int) -> str:
        return os.path.join(self.settings.run_dir, f"attempt-{attempt}")

    def count_progress(self, attempt: int) -> None:
        """Kept in the run's `no-progress` file, so that a requeued Slurm job goes on counting."""
        from ..watch.marks import progressed

        kept = progressed(self.settings.run_dir, attempt, self.started_at)
        if kept is None:
            return
        self.no_progress = 0 if kept else self.no_progress + 1
        from ..rundir.records import write_text

        with contextlib.suppress(OSError):
            path = os.path.join(self.settings.run_dir, NO_PROGRESS_FILE)
            write_text(path, f"{self.no_progress}\n")

    def drain(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass


def same_failure(a: FirstFailure, b: FirstFailure) -> bool:
    keys = ("label", "rank", "node")
    return all(a.get(k) == b.get(k) for k in keys) and a.get("attempt", b.get("attempt")) == \
        b.get("attempt", a.get("attempt"))  # fmt: skip


NO_PROGRESS_FILE = "no-progress"


def no_progress_count(run_dir: str) -> int:
    from ..rundir.regular import read_text

    try:
        text = read_text(os.path.join(run_dir, NO_PROGRESS_FILE), 64).strip()
    except OSError:
        return 0
    return int(text) if text.isascii() and text.isdigit() and len(text) < 8 else 0


def spec_of(run_dir: str) -> dict[str, Any]:
    from ..rundir.records import read_json

    spec = read_json(os.path.join(run_dir, "spec.json"))
    return spec if isinstance(spec, dict) else {}


def notifier(run_dir: str) -> Notifier | None:
    """None without webhooks, and then runtime/publish/webhooks.py is not even imported."""
    spec = spec_of(run_dir)
    if not spec.get("notify"):
        return None
    from ..publish.webhooks import Notifier

    return Notifier(os.path.abspath(run_dir), spec)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
