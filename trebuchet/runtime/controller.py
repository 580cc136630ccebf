"""The job controller on Slurm: what happens once per job, in the batch step.

Attempts (each one srun step of node agents, with the spec's pre/post commands around it),
retries within the allocation, log policies, the spec's `timeout` per attempt (as the local
supervisor: the checkpoint signal `warning` seconds before it, then the ranks stopped, the
attempt TIMEOUT and retried here when attempts remain), the job's time-limit warning
(Slurm's `--signal=B:SIG@warning` with `slurm.time`: the checkpoint signal to every rank,
then a requeue before the limit when attempts remain), requeue by Slurm, and the records
`treb` reads without sacct:
`attempt-<n>/attempt.json` and `result.json`. A requeued job starts this again from the
top; the attempt directories already present say which attempt it is.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

from . import contract, hang, policies, procs, tracking
from .agent import Agent
from .records import append_event, first_failure, now, read_json, write_json, write_text
from .task import PYTHON_GUARD

REQUEUE_WAIT_S = 600  # after `scontrol requeue`, Slurm ends this step well before this
ENDING_WAIT_S = 120  # Slurm's SIGTERM (then its SIGKILL, after KillWait) comes well before this
# squeue's states of a job that goes on; any other, while this batch step runs, means that
# Slurm is ending it (COMPLETING, REQUEUED, CANCELLED, PREEMPTED, ...)
GOING_ON = {"RUNNING", "SIGNALING", "RESIZING", "STAGE_OUT"}


def log(text: str) -> None:
    """A line of batch.log (Slurm's --output of the batch step)."""
    print(f"[treb {time.strftime('%H:%M:%S')}] {text}", flush=True)


def time_left(job_id: str) -> int:
    """Seconds until the job's time limit (squeue %L: [D-][H:]M:S); 0 when unknown."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", out)
    if not m:
        return 0
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return d * 86400 + h * 3600 + mi * 60 + s


class Controller:
    def __init__(self, job: dict[str, Any], job_path: str, runtime: str) -> None:
        self.job = job
        self.job_path = job_path
        self.runtime = runtime  # this .pyz: what the srun steps start on every node
        self.run_dir: str = job["run_dir"]
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.sig = job["checkpoint_signal"]  # e.g. SIGUSR2
        self.attempt = 0
        self.adir = ""
        self.t0: float | None = None
        self.step: subprocess.Popen[bytes] | None = None
        self.inline: Agent | None = None  # the job's only task, run here (job["inline"])
        self.signaller: subprocess.Popen[bytes] | None = None  # delivers the warning
        self.step_rc: int | None = None
        self.warned = self.requeued = self.terminating = False
        self.requeue_at: float | None = None
        self.state, self.reason = "", ""
        self.watch: hang.HangWatch | None = None  # while the ranks' step runs
        self.hung: dict[str, Any] | None = None  # this attempt was stopped for a hang
        self.hang_stop_at: float | None = None  # on_hang retry: the teardown, after the grace
        # the spec's timeout (monotonic times, armed while the ranks run), as locally
        self.warn_at: float | None = None
        self.timeout_at: float | None = None
        self.timeout_warned = self.timed_out = False  # in this attempt
        self._signals: list[int] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # -- records -------------------------------------------------------------------------
    def max_attempts(self) -> int:
        """retries + 1, plus the attempts the log policies granted so far (kept in a file,
        so that a requeued job keeps the count)."""
        try:
            with open(os.path.join(self.run_dir, "policy-retries")) as fh:
                granted = len(fh.read().splitlines())
        except OSError:
            granted = 0
        return int(self.job["max_attempts"]) + granted

    def attempt_json(self, state: str, reason: str, ended: float | None, source: str) -> None:
        master = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
        write_json(
            os.path.join(self.adir, "attempt.json"),
            {
                "attempt": self.attempt,
                "state": state,
                "reason": reason,
                "started_at": self.t0,
                "ended_at": ended,
                "source": source,
                "job_id": self.job_id,
                "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                "nodes": os.environ.get("SLURM_JOB_NODELIST", ""),
                "master": master,
                "srun_exit": self.step_rc,
                "max_attempts": self.max_attempts(),
            },
        )

    def result(self, state: str, reason: str, source: str) -> None:
        write_json(
            os.path.join(self.run_dir, "result.json"),
            {
                "state": state,
                "reason": reason,
                "source": source,
                "attempt": self.attempt,
                "exit_code": self.step_rc,
                "ended_at": now(),
                "job_id": self.job_id,
            },
        )
        # The MLflow run's status now, also when nobody follows the job (bounded: a
        # server that does not answer costs 2 x END_TIMEOUT_S, an event, nothing else).
        tracking.mark(self.run_dir, state, reason)

    def die(self, why: str) -> int:
        """The job cannot start: say why where `treb status` finds it."""
        log(f"error: {why}")
        self.result("FAILED", why, "batch")
        return 2

    # -- signals -------------------------------------------------------------------------
    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, getattr(signal, self.sig)):
            signal.signal(sig, lambda signum, _f: self._signals.append(signum))
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

    def _handle_signals(self) -> None:
        while self._signals:
            if self._signals.pop(0) == signal.SIGTERM:
                self.on_term()
            else:
                self.on_warning()

    def on_warning(self) -> None:
        """Slurm's --signal=B:SIG@warning: ask every rank to checkpoint, and requeue before
        the limit when another attempt is allowed."""
        if self.warned:
            return
        self.warned = True
        self.send_checkpoint("time limit near")
        running = self.step is not None or self.inline is not None
        if self.attempt + 1 < self.max_attempts() and running:
            margin = int(self.job["requeue_margin"])
            left = time_left(self.job_id)
            left = left - margin if left > margin + 1 else 1
            log(f"requeueing when the ranks stop, at the latest in {left}s")
            self.requeue_at = time.monotonic() + left

    def send_checkpoint(self, why: str) -> None:
        """The checkpoint signal to the ranks that handle it: the inline agent picks them
        itself; for an srun step, one more step (one task per node) does. Not `scancel
        --signal`: Slurm would signal every process of the step, and kill those without a
        handler."""
        if self.inline is not None:
            sent = len(self.inline.signal_all(getattr(signal, self.sig)))
            log(f"{why}: {self.sig} to the {sent} process(es) that handle it")
        elif self.step is not None:
            log(f"{why}: {self.sig} to the ranks that handle it (checkpoint now)")
            n = int(self.job["nodes"])
            argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1"]
            argv += ["--overlap", "--export=ALL", "sh", "-c", PYTHON_GUARD, "treb-agent"]
            argv += [self.runtime, "signal", self.sig, self.job_path]
            with contextlib.suppress(OSError):
                self.signaller = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

    def on_term(self) -> None:
        """Cancelled, time limit, preemption, requeue: record why, at once (Slurm's SIGKILL
        follows after KillWait)."""
        if self.requeued or self.terminating:
            return
        self.terminating = True
        state, reason = "CANCELLED", ""
        if os.path.exists(os.path.join(self.run_dir, "cancel-requested")):
            reason = "cancelled (treb cancel)"
        else:
            info = self.slurm_state()[0]
            if "TimeLimit" in info or (not info and self.warned):
                state, reason = "TIMEOUT", "time limit"
            else:
                reason = (
                    f"stopped by Slurm ({info or 'state unknown'}): scancel, preemption "
                    "or node failure"
                )
        self.state, self.reason = state, reason
        log(reason)
        if self.inline is not None:  # Slurm signals the batch step's processes: KILL at grace
            self.inline.teardown()
        if self.adir:
            self.attempt_json(state, reason, now(), "signal")
        self.result(state, reason, "signal")

    def slurm_state(self) -> tuple[str, bool]:
        """squeue's '%T %r' of this job ('COMPLETING None'; '' when squeue does not answer),
        and whether squeue was killed: Slurm's sweep over the job's processes takes it too."""
        try:
            res = subprocess.run(
                ["squeue", "-h", "-j", self.job_id, "-o", "%T %r"],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return "", False
        return (res.stdout.strip() if res.returncode == 0 else ""), res.returncode < 0

    def ended_by_slurm(self) -> bool:
        """Did the attempt's processes stop because Slurm ends the job (requeue, preemption,
        scancel)? Slurm marks the job first, then signals every process in it, so the ranks
        can die before this process sees its own SIGTERM. Then wait for that signal (on_term
        records why) rather than count a failure and retry inside a job that is going away."""
        self._handle_signals()
        if self.terminating:
            return True
        info, killed = self.slurm_state()
        state = info.split(" ")[0]
        if not killed and (not state or state in GOING_ON):
            return False
        log(f"the ranks stopped as Slurm ends the job ({state or 'squeue killed'}): waiting")
        end = time.monotonic() + ENDING_WAIT_S
        while not self.terminating and time.monotonic() < end:
            select.select([self._wake_r], [], [], 1.0)
            self._drain()
            self._handle_signals()
        return self.terminating

    def requeue(self) -> None:
        """A new allocation (and time limit) for the next attempt, same job id."""
        self.requeued = True
        self.attempt_json(
            "TIMEOUT",
            f"time limit: {self.sig} sent, job requeued for attempt {self.attempt + 2}",
            now(),
            "batch",
        )
        log(f"requeueing job {self.job_id} for attempt {self.attempt + 2}")
        if subprocess.run(["scontrol", "requeue", self.job_id]).returncode == 0:
            self._sleep(REQUEUE_WAIT_S)  # Slurm ends this step; the next start goes on
            sys.exit(0)
        self.requeued = False
        log("scontrol requeue failed: no further attempt")
        self.attempt_json("TIMEOUT", "time limit (requeue failed)", now(), "batch")

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            select.select([self._wake_r], [], [], min(1.0, end - time.monotonic()))
            self._drain()
            self._signals.clear()

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    # -- steps ---------------------------------------------------------------------------
    def run_step(self, srun_args: list[str], *words: str) -> int:
        """One srun step of node agents; signals are handled while it runs."""
        argv = [
            "srun",
            *srun_args,
            "sh",
            "-c",
            PYTHON_GUARD,
            "treb-agent",
            self.runtime,
            *words,
            self.job_path,
        ]
        self.step = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        try:
            while self.step.poll() is None:
                self._tick()
            self._handle_signals()
            return self.step.returncode
        finally:
            self.step = None

    def _tick(self) -> None:
        """One wait while the attempt's processes run: signals, the requeue timer, then
        sleep until a signal or 0.2 s."""
        self._handle_signals()
        if self.signaller is not None and self.signaller.poll() is not None:
            if self.signaller.returncode != 0:
                log(f"the {self.sig} step failed (srun exit {self.signaller.returncode})")
            self.signaller = None
        due = self.requeue_at is not None and time.monotonic() >= self.requeue_at
        if due and not self.terminating:
            self.requeue_at = None
            self.requeue()
        if self.watch is not None and self.hung is None and not self.terminating:
            found = self.watch.step()
            if found is not None:
                self.on_hang(found)
        if self.hang_stop_at is not None and time.monotonic() >= self.hang_stop_at:
            self.hang_stop_at = None
            self.stop_ranks(signal.SIGTERM)
        self._attempt_clock()
        select.select([self._wake_r], [], [], self._wait())
        self._drain()

    def arm_timeout(self, started: float) -> None:
        """The spec's timeout for this attempt, counted from its start (monotonic `started`,
        before `pre`) as the local supervisor counts it; the checkpoint signal `warning`
        seconds before it."""
        self.timeout_warned = self.timed_out = False
        limit = self.job.get("timeout")
        if not limit:
            self.warn_at = self.timeout_at = None
            return
        self.timeout_at = started + float(limit)
        self.warn_at = self.timeout_at - float(self.job.get("warning") or 0)

    def _attempt_clock(self) -> None:
        """While the ranks run: the checkpoint signal at `warning` before the timeout, then
        at the timeout the teardown marker (the agents count no rank failure) and a SIGTERM
        to the agents, which stop their ranks with the grace period."""
        if self.timeout_at is None or self.terminating or self.hung is not None:
            return
        at = time.monotonic()
        if self.warn_at is not None and at >= self.warn_at:
            self.warn_at = None
            self.timeout_warned = True
            self.send_checkpoint(f"timeout in {float(self.job.get('warning') or 0):g}s")
        if not self.timed_out and at >= self.timeout_at:
            self.timed_out = True
            log(
                f"timeout ({float(self.job['timeout']):g}s): stopping the ranks "
                f"(grace {self.job['grace']}s)"
            )
            write_text(os.path.join(self.adir, "teardown"), "timeout\n")
            self.stop_ranks(signal.SIGTERM)

    def _wait(self) -> float:
        """How long _tick sleeps: 0.2 s, less when the timeout (or its warning) is due
        sooner, so that it is kept to the tenth of a second."""
        if self.timeout_at is None or self.timed_out or self.terminating or self.hung is not None:
            return 0.2
        due = self.timeout_at if self.warn_at is None else self.warn_at
        return max(0.0, min(0.2, due - time.monotonic()))

    def timeout_reason(self) -> str:
        """The attempt's reason when the spec's timeout stopped it: 'timeout', as the local
        supervisor records it (the limit itself is in the spec and batch.log)."""
        return "timeout"

    def on_hang(self, info: dict[str, Any]) -> None:
        """No rank progressed for hang_timeout (runtime/hang.py), the stacks are in: say
        it, then on_hang: warn goes on; fail and retry stop the ranks, the teardown marker
        telling every agent that it is no failure. retry sends the checkpoint signal first
        and gives the handlers the grace period before the SIGTERM (as the local
        supervisor does): a SIGTERM at once could end a rank before its handler ran."""
        action = self.job.get("on_hang") or "fail"
        log(f"{hang.describe(info)}; on_hang: {action}")
        append_event(self.run_dir, "hang", attempt=self.attempt, action=action,
                     last_progress=info["last_progress"], detected_at=info["detected_at"],
                     stacks=len(info["stacks"]))  # fmt: skip
        if action == "warn":
            return
        self.hung = info
        write_text(os.path.join(self.adir, "teardown"), "hang\n")
        if action == "retry":
            self.stop_ranks(getattr(signal, self.sig))
            self.hang_stop_at = time.monotonic() + float(self.job["grace"])
            return
        self.stop_ranks(signal.SIGTERM)

    def stop_ranks(self, sig: int) -> None:
        """`sig` to the attempt's agents (SIGTERM: their teardown, with the grace period)."""
        if self.inline is not None:
            if sig == signal.SIGTERM:
                self.term_inline(self.inline)
            else:
                self.inline.signal_all(sig)
        elif self.step is not None:
            self.signal_steps(sig)

    @staticmethod
    def term_inline(agent: Agent) -> None:
        """The inline agent's teardown, with the SIGTERM that Slurm sends to an srun step's
        processes: its agent does not forward TERM (forward_term=False), so without this
        the rank would get only the SIGKILL after the grace period."""
        agent.teardown()
        for p in agent.procs:
            if p.alive and p.popen is not None:
                procs.signal_group(p.popen.pid, signal.SIGTERM)

    def signal_steps(self, sig: int) -> None:
        """A signal to every process of the job's running srun steps (`scancel --signal`:
        the agents then stop their ranks with the grace period; srun itself would answer a
        TERM with a forced termination)."""
        try:
            out = subprocess.run(
                ["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i"],
                capture_output=True, text=True, timeout=30,
            ).stdout.split()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            out = []
        steps = [s for s in out if re.fullmatch(r"\d+\.\d+", s)]
        name = signal.Signals(sig).name[3:]
        for step in steps:
            subprocess.run(["scancel", f"--signal={name}", step], stderr=subprocess.DEVNULL,
                           timeout=60)  # fmt: skip
        if not steps and self.step is not None:  # srun forwards it to every task
            with contextlib.suppress(OSError):
                self.step.send_signal(sig)

    def run_inline(self) -> int:
        """The job's only task (one node, one task, no srun needs: see slurm_script's
        `inline`) run by an agent in this process: no second interpreter, no srun step;
        the same records. Signals stay the controller's."""
        from .task import slurm_agent

        agent = slurm_agent(self.job, inline=True)
        self.inline = agent
        try:
            agent.start_all()
            while agent.poll():
                self._tick()
            self._handle_signals()
            return agent.exit_code()
        finally:
            self.inline = None

    def hooks(self, when: str) -> bool:
        """The spec's pre/post command once per node."""
        if not self.job.get(when):
            return True
        rc = self.run_step(self.job["srun_hook"], "hook", when)
        if rc != 0:
            log(f"{when} command failed on a node (exit {rc}): see {self.adir}/{when}-node-*.log")
        return rc == 0

    def run_attempt(self) -> None:
        self.adir = os.path.join(self.run_dir, f"attempt-{self.attempt}")
        os.makedirs(self.adir, mode=0o700, exist_ok=True)
        os.environ["TREB_ATTEMPT"] = str(self.attempt)
        self.t0, self.step_rc, started = now(), None, time.monotonic()
        self.timeout_warned = self.timed_out = False
        self.attempt_json("RUNNING", "", None, "batch")
        log(
            f"attempt {self.attempt + 1} of {self.max_attempts()}: {self.job['nodes']} node(s) "
            f"{os.environ.get('SLURM_JOB_NODELIST', '')}, master "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        )
        if not self.hooks("pre"):
            self.state, self.reason = "FAILED", "pre"
        else:
            self.hung = None
            if self.job.get("hang_timeout"):
                job = self.job
                names = hang.expected_names(job["launcher"], int(job["nodes"]), int(job["ppn"]))
                action = job.get("on_hang") or "fail"
                limit = float(job["hang_timeout"])
                self.watch = hang.HangWatch(self.adir, limit, action, names, self.t0)
            self.arm_timeout(started)
            try:
                if self.job.get("inline"):
                    rc = self.run_inline()
                else:
                    rc = self.run_step(self.job["srun"], "task")
            finally:
                self.watch = None
                self.hang_stop_at = self.warn_at = self.timeout_at = None
            self.requeue_at = None
            stopped_here = self.hung is not None or self.timed_out
            if self.terminating or (rc != 0 and not stopped_here and self.ended_by_slurm()):
                return
            self.step_rc = rc if rc >= 0 else 128 - rc
            if self.hung is not None:
                self.state, self.reason = "FAILED", "hang"
            elif self.timed_out or (rc != 0 and self.timeout_warned and self.died_of_warning()):
                self.state, self.reason = "TIMEOUT", self.timeout_reason()
            elif rc == 0:
                self.state, self.reason = "SUCCEEDED", ""
            elif self.warned:
                self.state = "TIMEOUT"
                self.reason = f"time limit: ranks stopped after {self.sig}"
            else:
                self.state, self.reason = "FAILED", self.failure_reason()
            if not self.hooks("post") and self.state == "SUCCEEDED":
                self.state, self.reason = "FAILED", "post"
        if not self.terminating:
            self.attempt_json(self.state, self.reason, now(), "batch")

    def first_failed(self) -> dict[str, Any] | None:
        """The attempt's first process that failed on its own, from its records."""
        records = []
        for name in sorted(os.listdir(self.adir)):
            rec = read_json(os.path.join(self.adir, name)) if name.endswith(".json") else None
            if isinstance(rec, dict) and name != "attempt.json":
                records.append(rec)
        first = first_failure(records)
        return first if isinstance(first, dict) else None

    def died_of_warning(self) -> bool:
        """After the timeout's warning, a rank that died of the checkpoint signal ends the
        attempt as the timeout would (as locally): part of the timeout, not a failure."""
        first = self.first_failed()
        return first is not None and first.get("signal") == self.sig

    def failure_reason(self) -> str:
        """Why the attempt failed, from its records: the first process that failed on its
        own ('rank 1 on tn2 exited with code 4'). srun's code is not it: srun returns the
        highest code of its tasks, e.g. 143 of a rank it stopped after the real failure."""
        first = self.first_failed()
        if first is None:
            return f"srun exited with code {self.step_rc}"
        who = f"rank {first['rank']}" if first.get("rank") is not None else str(first["label"])
        how = (
            f"was killed by {first['signal']}"
            if first.get("signal")
            else (f"exited with code {first['exit_code']}")
        )
        return f"{who} on {first.get('host', '?')} {how}"

    def apply_policy(self) -> str:
        """After a failed attempt: the log policies' verdict (runtime/policies.decide). The
        retries they granted are kept in `policy-retries`, one name a line, so that a
        requeued job keeps the count."""
        names = sorted(os.listdir(self.adir))
        logs = [os.path.join(self.adir, n) for n in names if re.fullmatch(r"rank-\d+\.log", n)]
        logs += [os.path.join(self.adir, n) for n in names if re.fullmatch(r"node-\d+\.log", n)]
        path = os.path.join(self.run_dir, "policy-retries")
        try:
            with open(path) as fh:
                used = fh.read().splitlines()
        except OSError:
            used = []
        granted = {name: used.count(name) for name in set(used)}
        verdict, policy, line = policies.decide(self.job["policies"], logs, granted)
        if policy is None:
            return verdict
        name, action = policy["name"], policy["action"]
        log(f"log policy {name} ({action}) matched: {line}")
        append_event(
            self.run_dir, "log_policy", attempt=self.attempt, policy=name, action=action, line=line
        )
        self.reason = f"{name}: {action}"
        if verdict == policies.RETRY:
            with open(path, "a") as fh:
                fh.write(name + "\n")
        return verdict

    # -- the job -------------------------------------------------------------------------
    def resume(self) -> int | None:
        """Which attempt this start of the job runs; an exit code when none is left."""
        while os.path.isdir(os.path.join(self.run_dir, f"attempt-{self.attempt}")):
            self.attempt += 1
        if self.attempt == 0:
            return None
        self.attempt -= 1
        self.adir = os.path.join(self.run_dir, f"attempt-{self.attempt}")
        prev = read_json(os.path.join(self.adir, "attempt.json")) or {"state": "RUNNING"}
        # Ended while running (no record, or the guess of the SIGTERM trap): this restart
        # shows that Slurm requeued the job.
        if prev.get("state") == "RUNNING" or prev.get("source") == "signal":
            self.t0 = prev.get("started_at")
            self.attempt_json(
                "FAILED",
                "requeued by Slurm (preemption, node failure or scontrol requeue)",
                now(),
                "batch",
            )
        self.attempt += 1
        for name in ("result.json", "cancel-requested"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, name))
        log(f"job {self.job_id} restarted (restart {os.environ.get('SLURM_RESTART_COUNT', 0)})")
        tracking.mark(self.run_dir, "RUNNING", "requeued")  # the same MLflow run goes on
        if self.attempt >= self.max_attempts():
            self.result(
                "FAILED",
                f"requeued after attempt {self.attempt}, but no attempt "
                f"is left (retries: {int(self.job['max_attempts']) - 1})",
                "batch",
            )
            return 1
        return None

    def prepare(self) -> int | None:
        """The job's environment: workdir, secrets, the rendezvous address; an exit code
        when the job cannot start."""
        job = self.job
        try:
            os.chdir(job["workdir"])
        except OSError:
            return self.die(f"cannot enter the workdir {job['workdir']} on {os.uname()[1]}")
        for name in job["secrets"]:
            if name not in os.environ:
                return self.die(
                    f"secret {name} is not in the job's environment (sbatch "
                    "exports the submitting environment; was it set there?)"
                )
        nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
        hosts = [nodelist] if re.fullmatch(r"[^,\[\]\s]+", nodelist) else []  # one plain name
        try:
            hosts = (
                hosts
                or subprocess.run(
                    ["scontrol", "show", "hostnames", nodelist],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=60,
                ).stdout.split()
            )
        except (OSError, subprocess.SubprocessError):
            return self.die("scontrol show hostnames failed")
        # The first node is the master; the port comes from the job id (the contract's
        # formula), so two jobs sharing a node do not collide. The spec's env wins.
        ours = {
            "TREB_RUN_ID": job["run_id"],
            "TREB_RUN_DIR": self.run_dir,
            "TREB_WORKDIR": job["workdir"],
            "TREB_CODE_DIR": job["workdir"],
            "TREB_CHECKPOINT_DIR": os.path.join(self.run_dir, "checkpoints"),
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": hosts[0] if hosts else "",
            "MASTER_PORT": str(job["master_port"] or contract.slurm_master_port(self.job_id)),
        }
        # The trackers' ids (tracking.json, written at submission): the same on every
        # attempt and requeue, so the ranks' own mlflow/wandb calls continue one run.
        ours.update(tracking.rank_env(tracking.load(self.run_dir)))
        for name, value in ours.items():
            if name not in job["spec_env"]:
                os.environ[name] = value
        return None

    def run(self) -> int:
        self.install_signals()
        code = self.resume()
        if code is None:
            code = self.prepare()
        if code is not None:
            return code
        while True:
            self.run_attempt()
            if self.terminating:
                break
            if self.state == "TIMEOUT":
                if self.attempt + 1 >= self.max_attempts():
                    break
                if self.warned:  # the job's own limit is near: a new allocation
                    self.requeue()
                    break
                log(f"attempt {self.attempt + 1} ended: {self.reason}: retrying")
                self.attempt += 1
                continue
            if self.state != "FAILED":
                break
            verdict = policies.NO_MATCH
            if self.hung is not None:  # on_hang decides; retry counts against `retries`
                if self.job.get("on_hang") == "retry" and self.attempt + 1 < self.max_attempts():
                    log(f"attempt {self.attempt} hung: retrying")
                    self.attempt += 1
                    continue
                break
            if not self.warned and self.reason not in ("pre", "post"):
                verdict = self.apply_policy()
                if verdict != policies.NO_MATCH:
                    self.attempt_json("FAILED", self.reason, now(), "batch")
            if verdict == policies.RETRY or (
                verdict != policies.FINAL
                and not self.warned
                and self.attempt + 1 < self.max_attempts()
            ):
                log(f"attempt {self.attempt + 1} failed ({self.reason}): retrying")
                self.attempt += 1
                continue
            break
        if self.terminating:
            while self.step is not None and self.step.poll() is None:
                time.sleep(0.2)
            return 143
        self.result(self.state, self.reason, "batch")
        log(
            f"run {self.job['run_id']}: {self.state}" + (f" ({self.reason})" if self.reason else "")
        )
        return 0 if self.state == "SUCCEEDED" else 1
