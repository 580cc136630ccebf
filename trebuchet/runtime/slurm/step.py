"""The job controller on Slurm: what happens once per job, in the batch step.

Attempts (an srun step of node agents, one per node; a retry on the same nodes runs on
the previous attempt's agents, parked in their step; the spec's pre/post commands around),
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
from typing import TYPE_CHECKING, Any

from ..contracts import rank_env as contract
from ..job import life as lifecycle
from ..job import link as agent_link
from ..job import nodeloss, selfrequeue
from ..node import barrier
from ..node.agent import Agent
from ..node.task import PLACEMENT_ENV, PYTHON_GUARD, node_agent
from ..process import procs
from ..publish import trackers as tracking
from ..rundir.records import (
    append_event,
    attempt_logs,
    attempt_records,
    first_failure,
    left_first_how,
    now,
    read_json,
    write_text,
)
from .records import BatchRecords, Field, log

if TYPE_CHECKING:
    from ..contracts.schema import FirstFailure, JobFile

REQUEUE_WAIT_S = 600  # after `scontrol requeue`, Slurm ends this step well before this
ENDING_WAIT_S = 120  # Slurm's SIGTERM (then its SIGKILL, after KillWait) comes well before this
# squeue's states of a job that goes on; any other, while this batch step runs, means that
# Slurm is ending it (COMPLETING, REQUEUED, CANCELLED, PREEMPTED, ...)
GOING_ON = {"RUNNING", "SIGNALING", "RESIZING", "STAGE_OUT"}
# An srun task's start: the interpreter given first ("" or one the node lacks: python3).
AGENT_START = 'p="$1"; shift; [ -n "$p" ] && [ -x "$p" ] && exec "$p" -S "$@"; ' + PYTHON_GUARD


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
    """Slurm's side of the job controller (runtime/job/life.JobController, which decides
    the attempts, the timeout and the hang watch): its Nodes (each attempt one srun step of
    node agents, or the job's only task in this process), its Records (records.py:
    attempt.json, result.json, batch.log); and what only Slurm has: the job's own time limit
    (the warning and the requeue), Slurm ending the job (SIGTERM), a requeued job's restart."""

    # the attempt as its records describe it (records.BatchRecords)
    attempt: Field[int] = Field("attempt")
    adir: Field[str] = Field("adir")
    t0: Field[float | None] = Field("t0")
    step_rc: Field[int | None] = Field("step_rc")
    state: Field[str] = Field("state")
    reason: Field[str] = Field("reason")
    use: Field[list[str]] = Field("use")  # this attempt's nodes (nodeset.choose): master first

    def __init__(self, job: JobFile, job_path: str, runtime: str) -> None:
        self.job = job
        self.rec = BatchRecords(job, lambda: self.terminating)
        self.job_path = job_path
        self.runtime = runtime  # this .pyz: what the srun steps start on every node
        self.run_dir: str = job["run_dir"]
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        # what squeue and scancel call this job: a job array's task by the array's name, as
        # the last task's own id is the array's (squeue -j lists, scancel cancels, them all)
        array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        self.slurm_job = f"{array}_{task}" if self.job_id and array and task else self.job_id
        self.sig = job["checkpoint_signal"]  # e.g. SIGUSR2
        self.step: subprocess.Popen[bytes] | None = None
        # steps whose agents all said they ended (agent_link) while srun still reports the
        # step's end: the next attempt does not wait for it; reaped at the job's end
        self.finishing: list[subprocess.Popen[bytes]] = []
        self.link: agent_link.Hub | None = None
        self.stepped = False  # a task step already ran in this allocation
        self.step_use: list[str] = []  # the nodes of the latest task step
        self.node_timeout = float(job.get("node_timeout") or agent_link.NODE_TIMEOUT_S)
        self.lost: str | None = None  # this attempt's lost node, as said (node_lost: ...)
        self.lost_kill_at: float | None = None  # then srun is ended at this time
        self.barrier_read_at = 0.0  # the nodes' health records read again (barrier_files)
        self.lost_after = False  # ... lost after the attempt's first failure: not its cause
        self.lost_hosts: list[str] = []
        # A lost node's step, its other agents parked in it (srun -k: it waits for the lost
        # node's tasks until the job ends): the next attempt runs on them and a spare's
        # step (spare_step); `kept` ends the attempt (poll); each is ended at the job's end
        self.kept: subprocess.Popen[bytes] | None = None
        self.lost_steps: list[subprocess.Popen[bytes]] = []
        self.spare_hosts: list[str] = []  # this attempt's nodes in a spare's step
        self.spare_end: float | None = None  # ... which ended early: the others' stop's end
        self.scancels: list[subprocess.Popen[bytes]] = []  # signals on their way (signal_steps)
        self.hosts: list[str] = []  # the allocation's nodes, in order
        self.inline: Agent | None = None  # the job's only task, run here (job["inline"])
        self.signaller: subprocess.Popen[bytes] | None = None  # delivers the warning
        self.rc = 0  # the attempt's step (or inline agent) exit status
        self.warned = self.requeued = self.terminating = False
        self.self_cancel = False  # the run ended cancelled: this job's own scancel is on its way
        self.requeue_at: float | None = None
        self.scontrol = "scontrol"  # the real one: the ranks' PATH has selfrequeue's first
        self._signals: list[int] = []
        self.lc = lifecycle.JobController(lifecycle.settings(job), self, self.rec,
                                          granted=self.rec.granted())  # fmt: skip
        self.rec.granted_by = self.lc.granted

    # -- Nodes (runtime/job/life.py): each attempt's srun step -------------------------
    def prepare(self) -> FirstFailure | None:
        return None  # resume() and setup() ran before the controller (run)

    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        self.lost = self.lost_kill_at = None
        self.lost_after = False  # this attempt's lost node was lost after its first failure
        self.choose_nodes()
        return {}

    def choose_nodes(self) -> None:
        """This attempt's nodes (runtime/job/nodeset.py): the first `nodes` of the allocation
        that no attempt lost or found unhealthy, fewer down to min_nodes; the master is the
        first of them. The job's ranks per node, hang watch and steps follow."""
        if self.job.get("inline") or not self.hosts:
            return
        want = int(self.job["nodes"])
        got = nodeloss.next_nodes(self.run_dir, self.hosts, want, self.job.get("min_nodes"))
        self.use = got.hosts or self.hosts[:want]  # none left: ending() said so already
        if "MASTER_ADDR" not in self.job["spec_env"]:
            os.environ["MASTER_ADDR"] = self.use[0]
        shape = self.lc.settings.shape
        self.lc.settings = self.lc.settings._replace(shape=(shape[0], len(self.use), shape[2]))

    def step_args(self, base: list[str], use: list[str] | None = None) -> list[str]:
        """An srun step's flags on this attempt's nodes (or `use`): as rendered when they
        are the whole allocation, else with their count, tasks and names (--nodelist)."""
        use = self.use if use is None else use
        if not use or (use == self.hosts and len(use) == int(self.job["nodes"])):
            return base
        n = len(use)
        per_node = next((int(a.split("=", 1)[1]) for a in base
                         if a.startswith("--ntasks-per-node=")), 1)  # fmt: skip
        out = [a for a in base if not a.startswith(("--nodes=", "--ntasks="))]
        return [f"--nodes={n}", f"--ntasks={n * per_node}", f"--nodelist={','.join(use)}",
                *out]  # fmt: skip

    def pre_post(self, when: str, attempt: int) -> bool:
        """The spec's pre/post command once per node (an srun step)."""
        if not self.job.get(when) or self.terminating:
            return True
        self.step = self.srun(self.step_args(self.job["srun_hook"]), "hook", when)
        stopped = False
        try:
            while self.step.poll() is None:
                self._tick()
                if self.lc.cancel_signal is not None and not stopped:  # no rank starts now
                    stopped = True
                    self.signal_steps(signal.SIGTERM)
                select.select([self.lc.wake_r], [], [], 0.2)
                self.lc.drain()
            self._handle_signals()
            rc = self.step.returncode
        finally:
            self.step = None
        if rc != 0 and self.lc.cancel_signal is None:
            log(f"{when} command failed on a node (exit {rc}): see {self.adir}/{when}-node-*.log")
        return rc == 0

    def start(self, attempt: int) -> None:
        if self.job.get("inline"):
            from ..node.task import slurm_agent

            # The job's only task (one node, one task, no srun needs: slurm_script's
            # `inline`) run by an agent in this process: no second interpreter, no srun
            # step; the same records. Signals stay the controller's.
            self.inline = slurm_agent(self.job, inline=True)
            self.inline.start_all()
        else:
            args = self.step_args(self.task_srun())
            kept, self.kept = self.kept, None
            self.spare_hosts, self.spare_end = [], None
            if self.resume_step(attempt, args) or self.spare_step(attempt, args, kept):
                return
            if self.link is not None:
                self.link.release()  # the previous step's parked agents exit
                self.link.expect(attempt, step_tasks(args))
            self.end_lost_steps()
            self.finishing = [p for p in self.finishing if p.poll() is None]
            # a retry: the previous step may still hold its CPUs while srun reports its end
            # (or slurmctld has not yet taken them back): without --overlap srun would wait
            overlap = ["--overlap"] if self.finishing or self.stepped else []
            self.stepped = True
            self.step = self.srun([*args, *overlap], "task")
            self.step_use = list(self.use)

    def no_kill(self) -> bool:
        """`srun --no-kill` where the agents park (rendered in job.json's `srun`:
        backends/slurm/script.py): a node's death then ends no task of the step but the
        dead node's (without it srun ends the whole step once slurmctld marks the node
        DOWN), so the survivors' agents stay parked for the spare's attempt. Not without
        the agent link (no socket here): the agents do not park then."""
        return self.link is not None and "--no-kill" in self.job["srun"]

    def task_srun(self) -> list[str]:
        """The ranks' srun flags as rendered, less `--no-kill` where no agent parks."""
        srun = self.job["srun"]
        return srun if self.no_kill() else [a for a in srun if a != "--no-kill"]

    def spare_step(
        self, attempt: int, args: list[str], kept: subprocess.Popen[bytes] | None
    ) -> bool:
        """After a lost node (its step `kept`, its other agents parked in it): the attempt on
        those parked agents, each told its new node rank, node count and master over the
        link (Hub.resume_on), and a step of one agent per node on the nodes that replace
        the lost one (the spares) alone, not a whole new step of every node's agent. False
        (a whole new step) where an agent did not park or the shape is not one agent per
        node."""
        if (kept is None or self.link is None or kept.poll() is not None
                or step_tasks(args) != len(self.use)
                or any(p.poll() is None for p in self.scancels)):  # fmt: skip
            return False
        master, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        job_nodes = self.job_nodelist()
        new = self.link.resume_on(attempt, self.use, master, port, job_nodes)
        if new is None:
            return False
        self.step_use = list(self.use)
        parked = len(self.use) - len(new)
        if not new:  # fewer nodes (a node range): the parked agents alone
            log(f"attempt {attempt + 1}: on the node agents of the previous attempt's srun step")
            self.step = kept  # srun waits for the lost node's tasks: the link says the end
            return True
        places = ",".join(f"{host}={self.use.index(host)}" for host in new)
        where = f"{len(self.use)};{places};{','.join(self.use)};{job_nodes}"  # task.place
        env = {**os.environ, PLACEMENT_ENV: where}
        log(f"attempt {attempt + 1}: on the {parked} node agent(s) parked in the previous "
            f"attempt's srun step and a new step on {','.join(new)}")  # fmt: skip
        self.spare_hosts = list(new)
        self.step = self.srun([*self.step_args(self.task_srun(), new), "--overlap"], "task",
                              env=env)  # fmt: skip
        return True

    def job_nodelist(self) -> str:
        """The job's nodes as Slurm has them now (squeue %N: with --no-kill a lost node
        leaves the job), for every rank's SLURM_JOB_NODELIST after a loss (a parked
        survivor's step began before it); else the allocation less the lost nodes."""
        try:
            out = subprocess.run(
                ["squeue", "-h", "-j", self.slurm_job, "-o", "%N"],
                capture_output=True, text=True, timeout=30,
            ).stdout.split()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            out = []
        if len(out) == 1 and re.fullmatch(r"[A-Za-z0-9._\-\[\],]+", out[0]):
            return out[0]
        lost = set(self.lost_hosts)
        return ",".join(h for h in self.hosts if h not in lost)

    def end_lost_steps(self) -> None:
        """The lost nodes' steps, which srun keeps waiting for: their parked agents were
        told to exit (Hub.release), no attempt runs on them any more."""
        for step in self.lost_steps:
            with contextlib.suppress(OSError):
                step.kill()
        for step in self.lost_steps:
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.wait(timeout=30)
        self.lost_steps = []

    def resume_step(self, attempt: int, args: list[str]) -> bool:
        """The attempt on the previous attempt's node agents, parked in their srun step
        (runtime/job/link.py): no new step, no new interpreter, so a retry in the same
        allocation starts in well under a second. Only on the same nodes, once every agent
        of the step parked and no signal of ours is still on its way to the step."""
        parked = self.finishing[-1] if self.finishing else None
        if (self.link is None or parked is None or parked.poll() is not None
                or self.use != self.step_use
                or any(p.poll() is None for p in self.scancels)):  # fmt: skip
            return False
        if not self.link.resume(attempt, step_tasks(args)):
            return False
        self.finishing.pop()
        self.step = parked
        log(f"attempt {attempt + 1}: on the node agents of the previous attempt's srun step")
        return True

    def poll(self) -> bool:
        self._tick()
        if self.inline is not None:
            alive = self.inline.poll()
            self.rc = self.inline.exit_code()
        elif self.step is not None and self.step is self.kept:  # a lost node's (watch_nodes)
            alive, self.rc = False, -signal.SIGKILL  # as when srun was ended
        elif self.step is not None:
            alive = self.step.poll() is None
            self.rc = self.step.returncode or 0
            if not alive and self.spare_hosts and self.link is not None:
                alive = self.spare_ended()
            code = self.link.ended() if alive and self.link is not None else None
            if code is not None:  # every agent's records are in: srun's report is late
                self.finishing.append(self.step)
                alive, self.rc = False, code
        else:
            alive = False
        if not alive:
            self._handle_signals()
        return alive

    def spare_ended(self) -> bool:
        """The spares' step ended before every agent of the attempt said it ended (its srun
        failed, its node died): the parked nodes' agents, in their own step, are stopped
        over the link (scancel after the grace period + 2 s). Whether the attempt goes on."""
        assert self.link is not None
        if self.link.ended() is not None:
            return False
        if self.spare_end is None:
            log(
                f"the new step on {','.join(self.spare_hosts)} ended (srun exit {self.rc}) "
                "before its node agents said so: stopping the other nodes' ranks"
            )
            self.spare_end = time.monotonic() + float(self.job["grace"]) + 2.0
            if not self.link.stop_all():
                self.signal_steps(signal.SIGTERM)
        if self.link.settled(self.spare_hosts):
            return False
        if time.monotonic() < self.spare_end:
            return True
        self.signal_steps(signal.SIGTERM)
        return False

    def checkpoint(self, signum: int) -> int:
        """The checkpoint signal to the ranks that handle it: for the timeout's warning or
        on_hang retry. A step's count is not known here (its own step delivers it): 1."""
        if self.terminating:
            return 0
        if self.lc.hang is not None:  # the agents count no rank it ends as a failure
            write_text(os.path.join(self.adir, "teardown"), "hang\n")
            why = "hang: on_hang retry"
        else:
            why = f"timeout in {float(self.job.get('warning') or 0):g}s"
        return self.send_checkpoint(why)

    def stop(self) -> None:
        """The teardown marker (the agents count no rank failure), then a SIGTERM to the
        agents, which stop their ranks with the grace period."""
        if self.terminating:
            return
        lc = self.lc
        cancel = lc.cancel_signal is not None and not lc.failed and lc.hang is None
        label = "hang" if lc.hang is not None else "cancel" if cancel else "timeout"
        label = "idle_gpu" if lc.idle_stop else label
        label = "node_lost" if self.lost and not self.lost_after else label
        if self.adir:
            write_text(os.path.join(self.adir, "teardown"), label + "\n")
        if label == "timeout":
            log(f"timeout ({self.job.get('timeout') or 0:g}s): stopping the ranks "
                f"(grace {self.job['grace']}s)")  # fmt: skip
        if label == "cancel" and lc.cancel_signal == signal.SIGINT:  # Ctrl+C, as torchrun
            g = float(self.job["grace"])
            log(f"interrupted: SIGINT to the ranks; SIGTERM to what still runs in {g:g}s, "
                f"SIGKILL in {2 * g:g}s")  # fmt: skip
            self.stop_ranks(signal.SIGINT)
            return
        self.stop_ranks(signal.SIGTERM)

    def kill(self) -> None:
        self.stop_ranks(signal.SIGKILL)

    def tick(self) -> None:
        """Signals and the requeue timer are looked at in poll (each loop step)."""

    def after(self, attempt: int, reason: str | None) -> None:
        """Whether Slurm is ending the job (its SIGTERM may come after the ranks died)."""
        self.step = self.inline = None
        self.requeue_at = None
        if not self.terminating:
            self.job_requeue()  # a rank asked, then ended: the requeue, not a failure
        ours = ("hang", "timeout", "idle_gpu", "cancel")  # the controller stopped it
        if not self.terminating and self.rc != 0 and reason not in ours:
            self.ended_by_slurm()

    def ending(self, attempt: int, reason: str | None) -> lifecycle.Ending:
        if self.terminating:
            return lifecycle.Ending(self.state or "CANCELLED", self.reason, engine_ended=True)
        rc = self.rc
        self.step_rc = rc if rc >= 0 else 128 - rc
        if self.lost and not self.lost_after:  # the attempt failed with it (its first
            # failure); another on other nodes, if any are left
            self.state, self.reason = "FAILED", self.lost
            left = self.nodes_left()
            if left:
                log(f"the next attempt cannot run: {left}")
                return lifecycle.Ending("FAILED", f"{self.lost}; {left}", final=True)
            return lifecycle.Ending("FAILED", self.lost)
        if reason == "cancel" and self.lc.cancel_signal == signal.SIGINT:  # Ctrl+C on `treb run`
            state, why = "CANCELLED", "cancelled (Ctrl+C): SIGINT to the ranks"
        elif reason == "cancel":  # `treb cancel` (SIGTERM to this controller alone: on_term)
            state, why = "CANCELLED", "cancelled (treb cancel)"
        elif reason in ("hang", "idle_gpu"):
            state, why = "FAILED", reason
        elif reason == "timeout" or (rc != 0 and self.lc.warned and self.died_of_warning()):
            state, why = "TIMEOUT", "timeout"  # the spec's timeout, as locally
        elif rc == 0:
            state, why = "SUCCEEDED", ""
        elif self.warned:
            state, why = "TIMEOUT", f"time limit: ranks stopped after {self.sig}"
        else:
            state, why = "FAILED", self.failure_reason()
        if reason == "post" and state == "SUCCEEDED":
            state, why = "FAILED", "post"
        self.state, self.reason = state, why
        left = self.nodes_left() if state == "FAILED" else ""
        if left:  # e.g. a node's health check excluded it (runtime/node/health.py)
            log(f"the next attempt cannot run: {left}")
            return lifecycle.Ending(state, f"{why}; {left}", final=True)
        return lifecycle.Ending(state, why, limit_near=self.warned)

    def nodes_left(self) -> str:
        """Why no next attempt can run on the allocation's nodes (too many excluded); ""
        when one can."""
        if self.job.get("inline") or not self.hosts:
            return ""
        nodes = nodeloss.next_nodes(self.run_dir, self.hosts, int(self.job["nodes"]),
                                    self.job.get("min_nodes"))  # fmt: skip
        return nodes.why_not

    def logs(self, attempt: int, cause: FirstFailure | None) -> list[str]:
        return attempt_logs(self.adir)  # the agents' records name the cause, not the index

    def exit_code(self) -> int:
        return self.step_rc or 0

    # -- signals -------------------------------------------------------------------------
    def install_signals(self) -> None:
        # SIGINT: Ctrl+C on an attached `treb run` (engine.py: scancel --signal=INT --batch)
        for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, self.sig)):
            signal.signal(sig, lambda signum, _f: self._signals.append(signum))
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.lc.wake_w, warn_on_full_buffer=False)

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if signum == signal.SIGTERM:
                self.on_term()
            elif signum == signal.SIGINT:
                self.on_interrupt()
            else:
                self.on_warning()

    def on_interrupt(self) -> None:
        """Ctrl+C on the attached `treb run`: the run is cancelled as torchrun hands Ctrl+C
        on (stop: SIGINT to the ranks, SIGTERM after the grace period, SIGKILL after
        another); a second one kills what is left. The job then ends by itself."""
        if self.terminating or self.requeued:
            return
        log("Ctrl+C on treb run: cancelling the run")
        self.lc.cancel(signal.SIGINT)

    def _tick(self) -> None:
        """While the attempt's processes run: signals, the warning's step, the requeue
        timer (the job controller sleeps and watches the rest)."""
        self._handle_signals()
        if self.signaller is not None and self.signaller.poll() is not None:
            if self.signaller.returncode != 0:
                log(f"the {self.sig} step failed (srun exit {self.signaller.returncode})")
            self.signaller = None
        self.scancels = [p for p in self.scancels if p.poll() is None]
        self.barrier_files()
        self.watch_nodes()
        if not self.requeued and not self.terminating:
            self.job_requeue()
        due = self.requeue_at is not None and time.monotonic() >= self.requeue_at
        if due and not self.terminating:
            self.requeue_at = None
            self.requeue()

    def barrier_files(self) -> None:
        """A task without a link says its node is healthy in its health record only, so
        the go over the link would never come: while it waits, the controller reads the
        attempt's records (one reader every barrier.FILES_S; agents with a link read none)
        and gives the go once every node is healthy in them (runtime/node/barrier.py)."""
        if self.link is None or self.step is None or self.terminating:
            return
        now = time.monotonic()
        if now < self.barrier_read_at:
            return
        self.barrier_read_at = now + barrier.FILES_S
        steps = self.link.barrier_steps()
        if not steps:
            return
        job = os.environ.get("SLURM_JOB_ID", "")
        nodes = len(self.use or self.hosts)
        if barrier.nodes_verdict(self.adir, self.attempt, nodes, {f"{job}.{s}" for s in steps}):
            log("every node's health record says healthy (a node agent without its link): go")
            self.link.go_all()

    def watch_nodes(self) -> None:
        """A node whose agents fell silent for node_timeout (agent_link) ends the attempt
        with that cause. srun would wait for the lost node's tasks until Slurm gives up on
        the node (SlurmdTimeout): it is ended once the other agents ended (at the latest
        after their grace period)."""
        if self.link is None or self.step is None or self.terminating:
            return
        failed_on = self.link.take_stop()
        if failed_on is not None:
            log(f"a rank failed on {failed_on}: the other node agents stop their ranks "
                "(a stop over the agent link, no scancel)")  # fmt: skip
        if self.link.stop_overdue(float(self.job["grace"]) + 2.0):  # agent_link's stop
            log("a node agent did not answer the stop over the link: scancel --signal=TERM")
            self.signal_steps(signal.SIGTERM)
        if self.lost is None:
            gone = self.link.lost(self.node_timeout)
            if gone:
                self.lost_hosts = [lost.host for lost in gone]
                self.on_node_lost(gone[0])
        elif self.lost_kill_at is not None:
            settled = self.link.settled(self.lost_hosts)
            if not settled and time.monotonic() < self.lost_kill_at:
                return
            self.lost_kill_at = None
            why = "the other nodes' agents ended" if settled else "the grace period is over"
            if settled and self.no_kill() and not self.terminating:
                log(f"{why}; srun waits for the lost node's tasks: its step is kept for the "
                    "other nodes' agents, parked in it for the next attempt")  # fmt: skip
                self.kept = self.step
                self.lost_steps.append(self.step)
                return
            log(f"{why}; srun still waits for the lost node's tasks: ending it")
            with contextlib.suppress(OSError):
                self.step.kill()

    def on_node_lost(self, lost: agent_link.Lost) -> None:
        """The cause on record (runtime/job/nodeloss.py: lost-<node>.json, which `treb` reads as
        the attempt's first failure, the event, the node's exclusion), then the attempt's
        teardown on the other nodes."""
        self.lost = nodeloss.silent(lost.host, self.node_timeout, lost.last_seen)
        log(self.lost)
        where = self.use or self.hosts  # the node's NODE_RANK in this attempt
        node = where.index(lost.host) if lost.host in where else len(where)
        # Lost during a teardown (an agent's rank failed first: its marker; or the
        # controller's own stop: a hang, the timeout, a cancel): excluded, srun ended, but
        # no cause: the first failure (or the hang, the timeout) stays the attempt's
        self.lost_after = self.lc.settled or os.path.exists(os.path.join(self.adir, "teardown"))
        nodeloss.record(self.run_dir, self.attempt, node, lost.host, self.lost, lost.last_seen,
                        after=self.lost_after)  # fmt: skip
        self.lost_kill_at = time.monotonic() + float(self.job["grace"]) + 2.0
        if not self.lost_after:
            self.lc.failure(None)

    def on_warning(self) -> None:
        """Slurm's --signal=B:SIG@warning (with slurm.time): ask every rank to checkpoint,
        and requeue before the limit when another attempt is allowed."""
        if self.warned:
            return
        self.warned = True
        self.send_checkpoint("time limit near")
        running = self.step is not None or self.inline is not None
        if self.attempt + 1 < self.rec.attempts_allowed() and running:
            margin = int(self.job["requeue_margin"])
            left = time_left(self.slurm_job)
            left = left - margin if left > margin + 1 else 1
            log(f"requeueing when the ranks stop, at the latest in {left}s")
            self.requeue_at = time.monotonic() + left

    def send_checkpoint(self, why: str) -> int:
        """The checkpoint signal to the ranks that handle it: the inline agent picks them
        itself; for an srun step, one more step (one task per node) does. Not `scancel
        --signal`: Slurm would signal every process of the step, and kill those without a
        handler. How many got it (1 for a step: its own step delivers it)."""
        if self.inline is not None:
            sent = len(self.inline.signal_all(getattr(signal, self.sig)))
            log(f"{why}: {self.sig} to the {sent} process(es) that handle it")
            return sent
        if self.step is not None:
            log(f"{why}: {self.sig} to the ranks that handle it (checkpoint now)")
            return 1 if self.node_step(self.sig) else 0  # its step delivers it: count unknown
        return 0

    def node_step(self, sig_name: str) -> bool:
        """One more step, one task per node of the attempt, that delivers `sig_name` there
        (task.deliver: the checkpoint signal to the ranks that handle it, SIGINT to the
        agents). Whether it started."""
        n = len(self.use) or int(self.job["nodes"])
        where = [f"--nodelist={','.join(self.use)}"] if self.use else []
        argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", *where]
        argv += ["--overlap", "--export=ALL", *self.agent_argv("signal", sig_name)]
        try:
            self.signaller = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        except OSError:
            return False
        return True

    def on_term(self) -> None:
        """Cancelled, time limit, preemption, requeue: record why, at once (Slurm's SIGKILL
        follows after KillWait)."""
        if self.requeued or self.terminating or self.self_cancel:
            return
        asked = os.path.exists(os.path.join(self.run_dir, "cancel-requested"))
        if asked and self.slurm_state()[0].startswith("RUNNING"):
            # `treb cancel` (scancel --signal=TERM --batch: this process alone): the ranks
            # are stopped as a local cancel stops them (SIGTERM, the spec's grace_period,
            # SIGKILL), not by Slurm's SIGTERM and its SIGKILL after KillWait; a second
            # cancel (or one after Ctrl+C) kills what is left, as locally
            if self.lc.cancel_signal is None:
                log(f"treb cancel: stopping the ranks (grace {self.job['grace']}s)")
            self.lc.cancel(signal.SIGTERM)
            return
        self.terminating = True
        self.lc.cancel(signal.SIGTERM)  # the controller stops; the records are written here
        state, reason = "CANCELLED", ""
        if asked:
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
            self.rec.attempt_json(state, reason, now(), "signal")
        self.rec.result(state, reason, "signal")

    def slurm_state(self) -> tuple[str, bool]:
        """squeue's '%T %r' of this job ('COMPLETING None'; '' when squeue does not answer),
        and whether squeue was killed: Slurm's sweep over the job's processes takes it too."""
        try:
            res = subprocess.run(
                ["squeue", "-h", "-j", self.slurm_job, "-o", "%T %r"],
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
            select.select([self.lc.wake_r], [], [], 1.0)
            self.lc.drain()
            self._handle_signals()
        return self.terminating

    def job_requeue(self) -> None:
        """A rank asked Slurm to requeue the job (`scontrol requeue`: Lightning's SLURM
        auto-requeue, submitit; selfrequeue.py hands it here): requeue it as this
        controller's own requeue when an attempt is left, else say why not (the job goes on,
        to its time limit)."""
        who = selfrequeue.asked(self.run_dir)
        if who is None:
            return
        allowed = self.rec.attempts_allowed()
        append_event(self.run_dir, "job_requeue", attempt=self.attempt, who=who,
                     granted=self.attempt + 1 < allowed)  # fmt: skip
        if self.attempt + 1 >= allowed:
            log(f"{who} asked to requeue the job (scontrol requeue), but no attempt is left "
                f"(retries: {allowed - 1}): not requeued; raise `retries` to let it")  # fmt: skip
            return
        log(f"{who} asked to requeue the job (scontrol requeue): trebuchet requeues it")
        limit = f"time limit: {self.sig} sent, " if self.warned else ""
        self.requeue(f"{limit}requeued at the job's request ({who}: scontrol requeue)",
                     "TIMEOUT" if self.warned else "FAILED")  # fmt: skip

    def requeue(self, why: str | None = None, state: str = "TIMEOUT") -> None:
        """Nodes: a new allocation (and time limit) for the next attempt, same job id;
        returns only when Slurm refused it. `why`: the attempt's reason (default: the
        time limit's requeue)."""
        self.requeued = True
        self.rec.attempt_json(
            state,
            why or f"time limit: {self.sig} sent, job requeued for attempt {self.attempt + 2}",
            now(),
            "batch",
        )
        log(f"requeueing job {self.slurm_job} for attempt {self.attempt + 2}")
        if subprocess.run([self.scontrol, "requeue", self.slurm_job]).returncode == 0:
            self._sleep(REQUEUE_WAIT_S)  # Slurm ends this step; the next start goes on
            sys.exit(0)
        self.requeued = False
        log("scontrol requeue failed: no further attempt")
        self.rec.attempt_json("TIMEOUT", "time limit (requeue failed)", now(), "batch")

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            select.select([self.lc.wake_r], [], [], min(1.0, end - time.monotonic()))
            self.lc.drain()
            self._signals.clear()

    # -- steps ---------------------------------------------------------------------------
    def srun(self, srun_args: list[str], *words: str,
             env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
        """One srun step of node agents."""
        return subprocess.Popen(["srun", *srun_args, *self.agent_argv(*words)],
                                stdin=subprocess.DEVNULL, env=env)  # fmt: skip

    def agent_argv(self, *words: str) -> list[str]:
        """What an srun task runs: this runtime's verb, started by the interpreter that runs
        this controller where the node has it (the batch step's environment, as setup made
        it, reaches the agents and ranks as is: a `python3` that is a pyenv shim would put
        its own folders first on PATH), else by the node's `python3` (a container image)."""
        image = any(a.startswith("--container-image=") for a in self.job["srun"])
        python = "" if image else sys.executable
        return ["sh", "-c", AGENT_START, "treb-agent", python, self.runtime, *words,
                self.job_path]  # fmt: skip

    def stop_ranks(self, sig: int) -> None:
        """`sig` to the attempt's agents (SIGTERM: their teardown, with the grace period)."""
        if self.inline is not None:
            if sig == signal.SIGTERM:
                self.term_inline(self.inline)
            elif sig == signal.SIGINT:  # the agent hands it on: INT, TERM, KILL
                self.inline.teardown(signal.SIGINT)
            else:
                self.inline.signal_all(sig)
        elif self.step is not None and sig == signal.SIGINT:
            self.node_step("SIGINT")  # to each node's agents, never to every process
        elif self.step is not None and not (sig == signal.SIGTERM and self.stop_over_link()):
            self.signal_steps(sig)

    def stop_over_link(self) -> bool:
        """The teardown's SIGTERM as the `stop` word to every node agent of the attempt
        (agent_link.Hub.stop_all: each stops its ranks, the grace period, SIGKILL), as on a
        rank's failure: no scancel through slurmctld. Only where the agents take the word
        (they park: parks()); False (the caller scancels) where one cannot be reached;
        one that has not ended within the grace period + 2 s gets the scancel then
        (watch_nodes)."""
        if self.link is None or not parks(self.job):
            return False
        if self.link.stop_all():
            log("stopping the ranks over the agent link (no scancel)")
            return True
        log("a node agent cannot be reached over the link: scancel --signal=TERM")
        return False

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
        for step in steps:  # not waited for: slurmctld answers only once every node did
            # (MessageTimeout, 10 s, for a node that is gone); reaped in _tick
            self.scancels.append(subprocess.Popen(["scancel", f"--signal={name}", step],
                                                  stderr=subprocess.DEVNULL))  # fmt: skip
        if not steps and self.step is not None:  # srun forwards it to every task
            with contextlib.suppress(OSError):
                self.step.send_signal(sig)

    def first_failed(self) -> FirstFailure | None:
        """The attempt's first process that failed on its own, from its records."""
        first = first_failure(attempt_records(self.adir))
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
        if first.get("label") == "node_unhealthy":  # its message names the check (health.py)
            return str(first.get("message"))
        who = f"rank {first['rank']}" if first.get("rank") is not None else str(first["label"])
        how = (
            f"was killed by {first['signal']}"
            if first.get("signal")
            else (f"exited with code {first['exit_code']}")
        )
        if first.get("left_first"):  # its SIGTERM is the launcher's (records.left_first)
            how = left_first_how(first)
        return f"{who} on {first.get('host', '?')} {how}"

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
            lost = self.first_failed()  # the batch host's loss, as its agents said it
            why = lost.get("message") if lost and lost.get("label") == "node_lost" else None
            self.rec.attempt_json(
                "FAILED",
                str(why or "requeued by Slurm (preemption, node failure or scontrol requeue)"),
                now(),
                "batch",
            )
        self.attempt += 1
        for name in ("result.json", "cancel-requested"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.run_dir, name))
        log(f"job {self.job_id} restarted (restart {os.environ.get('SLURM_RESTART_COUNT', 0)})")
        tracking.mark(self.run_dir, "RUNNING", "requeued")  # the same MLflow run goes on
        if self.attempt >= self.rec.attempts_allowed():
            self.rec.result(
                "FAILED",
                f"requeued after attempt {self.attempt}, but no attempt "
                f"is left (retries: {int(self.job['max_attempts']) - 1})",
                "batch",
            )
            return 1
        return None

    def setup(self) -> int | None:
        """The job's environment: workdir, secrets, the rendezvous address; an exit code
        when the job cannot start."""
        job = self.job
        try:
            os.chdir(job["workdir"])
        except OSError:
            return self.rec.die(f"cannot enter the workdir {job['workdir']} on {os.uname()[1]}")
        for name in job["secrets"]:
            if name not in os.environ:
                return self.rec.die(
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
            return self.rec.die("scontrol show hostnames failed")
        self.hosts = hosts
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
        self.scontrol = selfrequeue.install(self.run_dir)  # a rank's requeue comes here
        return None

    def open_link(self) -> None:
        """The agents' line to this process (agent_link), through the steps' environment;
        without it (no socket here) the attempts end when srun says so."""
        try:
            self.link = agent_link.Hub(self.lc.wake_w)
        except OSError as exc:
            log(f"no agent link ({exc}): each attempt waits for its srun step's end")
            return
        os.environ[agent_link.ENV] = self.link.address(os.uname().nodename)
        if parks(self.job):
            os.environ[agent_link.PARK_ENV] = "1"

    def run(self) -> int:
        self.install_signals()
        code = self.resume()
        if code is None:
            code = self.setup()
        if code is not None:
            return code
        if not self.job.get("inline"):
            self.open_link()
        state = self.lc.run(first=self.attempt)
        if self.link is not None:
            self.link.release()  # no attempt follows: the parked agents exit
        self.end_lost_steps()
        for step in [*self.finishing, *self.scancels]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.wait(timeout=30)
        if self.terminating:
            return 143
        if state == "CANCELLED" and self.lc.cancel_signal is not None:
            self.cancel_own_job()
        return {"SUCCEEDED": 0, "CANCELLED": 130}.get(state, 1)  # 130: Ctrl+C's, as treb run

    def cancel_own_job(self) -> None:
        """A run the user cancelled (Ctrl+C on `treb run`, `treb cancel`: a signal to this
        controller alone, which stopped the ranks as a local cancel does) ends CANCELLED in
        Slurm too, as after `scancel`: without this the batch step's exit (130) made the
        job FAILED in squeue and sacct. Its records are written; the SIGTERM that follows
        (on_term) changes nothing."""
        if not self.job_id:
            return
        self.self_cancel = True  # slurm_job: scancel refuses a task's own id (22.05)
        log(f"the run was cancelled: scancel {self.slurm_job} (Slurm records it CANCELLED)")
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", self.slurm_job], stdin=subprocess.DEVNULL, timeout=60)


def parks(job: JobFile) -> bool:
    """Whether the agents wait in their step for the next attempt (runtime/job/link.py):
    one node agent per node (native, torchrun, none). Not with pre/post, whose steps need
    the node's CPUs that a parked step holds (--whole); not where srun starts each rank
    (slurm.mpi: PMIx wires up a task once) nor under mpirun (its daemons' own steps)."""
    if job.get("pre") or job.get("post"):
        return False
    return job["launcher"] in ("torchrun", "none") or (
        job["launcher"] == "native" and node_agent(job)
    )


def step_tasks(srun_args: list[str]) -> int:
    """The tasks of an srun step (its --ntasks); 0 when not said (no early end then)."""
    for arg in srun_args:
        if arg.startswith("--ntasks="):
            with contextlib.suppress(ValueError):
                return int(arg.split("=", 1)[1])
    return 0
