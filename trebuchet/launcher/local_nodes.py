"""The local engine's Nodes for the job controller (runtime/job/life.py): one runtime Agent
per simulated node, driven in the supervisor's process, and around them the run's watchdog,
cgroup, environment and the strays' end. The supervisor's process (supervisor.py) imports
this module once the run's cgroup move has begun: its imports (the agent, its log readers,
the job controller, the health checks: ~100 modules) then pass during the move's wait.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trebuchet.launcher.hooks import Hooks
from trebuchet.launcher.index_records import IndexRecords
from trebuchet.launcher.node_health import check_nodes
from trebuchet.launcher.plan import free_port
from trebuchet.launcher.rank_wrapper import AGENT_LAUNCHERS, rank_records
from trebuchet.launcher.sim_nodes import SHRINKS, Keepers, names
from trebuchet.launcher.supervisor import begin
from trebuchet.runtime.contracts import secrets
from trebuchet.runtime.contracts.schema import FirstFailure, JobFile, Outcome, ProcPlan
from trebuchet.runtime.job.life import Ending, JobController, settings
from trebuchet.runtime.job.retry_codes import NOT_A_PROGRAM as LOST_LABELS
from trebuchet.runtime.node.agent import Agent, Proc
from trebuchet.runtime.process import contain
from trebuchet.runtime.process.procs import (
    alive,
    become_subreaper,
    children,
    descendants,
    reap,
    signal_pid,
    start_time,
)
from trebuchet.runtime.publish import trackers as tracking
from trebuchet.runtime.rundir import records
from trebuchet.runtime.rundir.records import sync
from trebuchet.store.db import Store
from trebuchet.store.files import append_event
from trebuchet.store.lifecycle import run_started
from trebuchet.store.states import CANCELLED, FAILED, SUCCEEDED, TIMEOUT, first_failure

if TYPE_CHECKING:
    from trebuchet.launcher.supervisor import Begun
    from trebuchet.launcher.watchdog import Watchdog
    from trebuchet.view.live import View


# Freed when the disk fills during the run, so that the index and events.jsonl can still
# say why the run stopped (after the run's processes are killed, nobody else takes it).
RESERVE, RESERVE_BYTES = ".space-reserve", 256 << 10


def reserve_space(path: Path) -> None:
    """Allocate the reserve (fallocate: no data written); skipped when the disk is full."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.write(fd, b"\0" * RESERVE_BYTES)
    finally:
        os.close(fd)


class Supervisor:
    """The local engine's side of the job controller (runtime/lifecycle.JobController, which
    decides the attempts): one runtime Agent per simulated node, driven in this process, and
    around them the run's watchdog, cgroup, environment and the strays' end."""

    def __init__(
        self,
        job: JobFile,
        store: Store,
        view: View | None = None,
        own_process: bool = False,
        begun: Begun | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self.jobfile = job  # contracts.JobFile: what the job controller reads
        self.local = job["plan"]  # this engine's processes (launcher/plan.py)
        self.hooks = hooks or Hooks()
        self._begun = begun  # the watchdog and cgroup, when the caller began them (begin)
        self.store = store
        self.view = view  # attached: the terminal view, a thread of its own
        self.run_dir = Path(job["run_dir"])
        self.agents: list[Agent] = []  # one per simulated node, this attempt's
        self.watchdog: Watchdog | None = None
        # A process of its own (not a caller's, whose other children are not the run's):
        # it adopts the ranks' orphans and ends them with the attempt.
        self.subreaper = own_process and become_subreaper()
        self.cgroup: str | None = None
        self._adopted: set[int] = set()  # told to the watchdog
        self._scanned = False  # the last _kill_strays scanned /proc for TREB_RUN_ID
        self.port = self.local["master_port"]
        # MLFLOW_RUN_ID, WANDB_RUN_ID...: the same for every attempt (docs/tracking.md)
        self.tracking_env = tracking.rank_env(tracking.load(job["run_dir"]))
        self.records = IndexRecords(store, job["run_id"], self.run_dir, self._say,
                                    self.hooks.hang_lines)  # fmt: skip
        self.job = JobController(settings(job), self, self.records)
        self.keepers = keepers(job)  # simulated nodes that can be lost (sim_nodes.py)

    @property
    def cancel_signal(self) -> int | None:
        return self.job.cancel_signal

    @property
    def attempt(self) -> int:
        return self.job.attempt

    # -- signals ---------------------------------------------------------------------------
    def install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_cancel)
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, self._on_forward)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.job.wake_w, warn_on_full_buffer=False)

    def _on_cancel(self, signum: int, _frame: object) -> None:
        self.job.cancel(signum)

    def _on_forward(self, signum: int, _frame: object) -> None:
        self.signal_ranks(signum)

    @property
    def procs(self) -> list[Proc]:
        return [p for agent in self.agents for p in agent.procs]

    def signal_ranks(self, signum: int) -> int:
        """The checkpoint signal (or a forwarded USR1/USR2) to the ranks that handle it, by
        the runtime's one rule (Agent.signal_all); how many processes got it."""
        return sum(len(agent.signal_all(signum)) for agent in self.agents)

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> str:
        rid = self.jobfile["run_id"]
        self.watchdog, self.cgroup, how = self._begun or begin(self.jobfile)
        self._begun = None
        run_started(self.store, rid, cgroup=self.cgroup)
        contain.record(str(self.run_dir), self.cgroup, how)
        reserve = self.run_dir / RESERVE
        reserve_space(reserve)
        try:
            state = self.job.run()
        except BaseException:
            self.abort()  # the watchdog is told `done` below: nothing of the run may outlive it
            raise
        finally:
            reserve.unlink(missing_ok=True)  # before the outcome is recorded (main)
            contain.leave_early(self.cgroup)  # an attempt that failed before its first start
            with contextlib.suppress(OSError):  # post's daemons; the cgroup goes
                self._kill_strays(self.attempt, keep=False, scan=self._scan_again())
            self.watchdog.done()
            if self.local["environment"] and self.local["environment"].get("cleanup"):
                from trebuchet.envs.build import remove
                from trebuchet.envs.recipe import Recipe

                remove(Recipe.from_json(self.local["environment"]))
        self.close_trackers()
        return state

    def reap(self) -> None:
        """The last step: wait for the watchdog, told `done` at the end of run() (it may
        still have been starting beside the ranks; the run's summary does not wait)."""
        if self.watchdog:
            self.watchdog.wait()

    def close_trackers(self) -> None:
        """The end of the run in its trackers, after everything is recorded: bounded
        requests, and no failure of theirs reaches the run (trebuchet/tracking.py)."""
        if not self.tracking_env or self.hooks.close_trackers is None:
            return
        try:
            self.hooks.close_trackers(self.store, self.jobfile["run_id"])
        except Exception as exc:  # noqa: BLE001
            tracking.failed(str(self.run_dir), "mlflow", f"{type(exc).__name__}: {exc}")

    def abort(self) -> None:
        """The supervisor itself failed (a full disk, a bug): SIGKILL every process of the
        run now; recording anything may fail too, so nothing here depends on it."""
        for agent in self.agents:
            agent.kill(stopped=True)
        exclude = {os.getpid(), self.watchdog.pid if self.watchdog else -1}
        contain.end_run(self.jobfile["run_id"], str(self.run_dir), exclude, keep=True)

    def prepare(self) -> FirstFailure | None:
        """Nodes: build or reuse the run's environment; the cause when that fails."""
        if not self.local["environment"]:
            return None
        from trebuchet.envs.build import BuildError, ensure
        from trebuchet.envs.recipe import Recipe

        recipe = Recipe.from_json(self.local["environment"])
        log_path = self.run_dir / "environment.log"
        self._say(f"environment {recipe.name} ({recipe.kind}): checking")
        t0 = time.time()
        try:  # in the run's cgroup: should this process die, the watchdog ends the build too
            with open(log_path, "a") as log, contain.inside(self.cgroup):
                info = ensure(recipe, log)
        except (BuildError, OSError) as exc:
            cause = records.cause("environment", 1, 0, log=str(log_path), message=str(exc))
            self.store.set_attempt(
                self.jobfile["run_id"], 0, state=FAILED, started_at=t0, ended_at=time.time(),
                reason="environment build failed",
            )  # fmt: skip
            append_event(self.run_dir, "environment_failed", error=str(exc))
            self._say(f"environment build failed: {exc}")
            return cause
        append_event(
            self.run_dir, "environment_ready", reused=info.get("reused"),
            seconds=time.time() - t0, stamp=recipe.stamp, prefix=recipe.prefix,
        )  # fmt: skip
        verb = "reused" if info.get("reused") else "built"
        self._say(f"environment {recipe.name} {verb} in {time.time() - t0:.2f}s")
        return None

    # -- Nodes (runtime/job/life.py): this engine's side of each attempt -------------------
    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        contain.enter_early(self.cgroup)  # (begun in run() already, unless it built an env)
        port = self.local["master_port"]
        if attempt and self.local["port_auto"]:  # the old port may linger in TIME_WAIT
            port = free_port(self.local["master_addr"])
        self.port = port
        self.agents = []
        return {"master_port": port}

    def pre_post(self, when: str, attempt: int) -> bool:
        return self._run_hooks(when, self.run_dir / f"attempt-{attempt}", attempt)

    def start(self, attempt: int) -> None:
        adir = self.run_dir / f"attempt-{attempt}"
        if attempt and self.watchdog:  # the last attempt's groups and orphans are gone
            self.watchdog.reset()
            self._adopted.clear()
        plans = self.local["procs"]
        if self.keepers is not None:  # the nodes left (a spare in; fewer: the world shrinks)
            before = list(self.keepers.active)
            now = self.keepers.start(attempt)
            plans = self.keepers.plans(plans, int(self.jobfile["ppn"]))
            if attempt and now and now != before:  # said as over ssh (backends/ssh/run.py)
                from trebuchet.runtime.job.nodeset import excluded

                gone = ", ".join(excluded(str(self.run_dir)))
                world = len(now) * int(self.jobfile["ppn"])
                self._say(f"nodes now: {', '.join(now)} (WORLD_SIZE {world}; excluded: {gone})")
        self.agents = self._agents(plans, adir, attempt, self.port)
        held = self.keepers.active if self.keepers is not None else None
        sick = check_nodes(str(self.run_dir), adir, attempt, self.agents, self.jobfile, held)
        if sick is not None:  # no rank starts; the node is lost (runtime/node/health.py)
            self._say(str(sick.get("message")))
            sync([path for agent in self.agents for path in agent.take_unsynced()])
            self.agents = []
            self.job.failure(sick, stop=False)
            return
        self._start(self.agents)
        self.store.set_procs(self.jobfile["run_id"], attempt, self.outcomes())
        if self.view:
            for label, name in self.local["streams"]:
                self.view.add(label, adir / name)

    def outcomes(self) -> list[Outcome]:
        """The ranks' records as the store keeps them, with this machine's name: every
        process row says its host (its pid means something there only)."""
        host = os.uname().nodename
        return [{**p.outcome(), "host": host} for p in self.procs]

    def poll(self) -> bool:
        if self.keepers is not None:
            # a simulated node died: its ranks with it (once the attempt failed or is being
            # stopped, its loss is recorded and excluded, but it is no cause)
            after = self.job.settled
            for k in self.keepers.gone(after=after):
                lost = self.keepers.lost[k]
                self._say(f"{lost.get('message')}: stopping the others")
                if k < len(self.agents):
                    self.agents[k].kill(stopped=True)
                if not after:
                    self.job.failure(lost)
        alive = any([agent.poll() for agent in self.agents])
        if not alive:  # all their ENDED records at once: the attempt's folder synced once
            sync([path for agent in self.agents for path in agent.take_unsynced()])
        return alive

    def checkpoint(self, signum: int) -> int:
        return self.signal_ranks(signum)

    def stop(self) -> None:
        """SIGTERM every live process group; each agent SIGKILLs what is left after the
        grace period. A cancel by SIGINT (Ctrl+C) starts with SIGINT instead, as torchrun
        hands Ctrl+C on: a Python rank's `except KeyboardInterrupt:` runs; SIGTERM follows
        after the grace period, SIGKILL after another (Agent.teardown)."""
        interrupt = self.job.cancel_signal == signal.SIGINT and not self.job.failed
        if interrupt and self.agents:
            g = float(self.jobfile["grace"])
            self._say(f"interrupted: SIGINT to the ranks; SIGTERM to what still runs in {g:g}s, "
                      f"SIGKILL in {2 * g:g}s; Ctrl+C again to kill them now")  # fmt: skip
        for agent in self.agents:
            agent.teardown(signal.SIGINT if interrupt else signal.SIGTERM)

    def kill(self) -> None:
        for agent in self.agents:
            agent.kill()

    def tick(self) -> None:
        if self.subreaper:
            self._announce_adopted()

    def after(self, attempt: int, reason: str | None) -> None:
        if self.keepers is not None:
            self.keepers.close(after=self.job.settled)
        self._kill_strays(attempt)

    def ending(self, attempt: int, reason: str | None) -> Ending:
        adir = self.run_dir / f"attempt-{attempt}"
        # the workers' own records too under an agent launcher (none for the native one)
        workers = rank_records(adir) if self.jobfile["launcher"] in AGENT_LAUNCHERS else []
        records = self.outcomes() + workers
        self.store.set_procs(self.jobfile["run_id"], attempt, records, reason is not None)
        states: dict[str | None, str] = {
            "cancel": CANCELLED, "timeout": TIMEOUT, "failure": FAILED, "post": FAILED,
            "hang": FAILED, "idle_gpu": FAILED,
        }  # fmt: skip
        state = states.get(reason, SUCCEEDED)
        if reason is None and any(p.returncode != 0 for p in self.procs):
            state = FAILED
        if self.keepers is not None and state == FAILED:
            return self._node_lost(reason)
        return Ending(state, reason)

    def _node_lost(self, reason: str | None) -> Ending:
        """A failed attempt of a run that can lose simulated nodes: the attempt's reason is
        the lost node's when its loss was the first failure (a node lost after it, during
        the teardown, is excluded but changes no cause: JobController.settle). A lost or
        unhealthy node and too few left (no spare): no next attempt."""
        assert self.keepers is not None
        why = reason
        first = self.job.first_failure
        if first is not None and first.get("label") in LOST_LABELS:
            why = str(first.get("message"))
        cannot = self.keepers.next_ok()
        if cannot:
            self._say(f"no spare to go on with: {cannot}")
        return Ending(FAILED, why, final=bool(cannot))

    def logs(self, attempt: int, cause: FirstFailure | None) -> list[str]:
        adir = self.run_dir / f"attempt-{attempt}"
        logs = [adir / p["log"] for p in self.local["procs"]]
        logs += [adir / name for _, name in self.local["streams"] if adir / name not in logs]
        if cause and cause.get("log"):
            logs.insert(0, Path(cause["log"]))
        return [str(path) for path in logs]

    def exit_code(self) -> int:
        return next((c for c in (p.exit_code for p in self.procs) if c), 0)

    def requeue(self) -> None:
        raise AssertionError("the local engine has no time limit of its own")

    # -- the processes ---------------------------------------------------------------------
    def _agents(self, plans: list[ProcPlan], adir: Path, attempt: int, port: int,
                record: bool = True) -> list[Agent]:  # fmt: skip
        """One node agent per simulated node, driven by this supervisor's loop."""
        by_node: dict[int, list[Proc]] = {}
        base = {**os.environ, **self.tracking_env, "TREB_ATTEMPT": str(attempt)}  # read once
        prepend = self.local["path_prepend"]
        if prepend:
            base["PATH"] = os.pathsep.join([*prepend, os.environ.get("PATH", "")])
        names = self.jobfile["secrets"]
        for p in plans:
            env = base.copy()
            env.update(
                {k: secrets.resolve(v, names, os.environ) if names and "${" in v else v
                 for k, v in p["env"].items()}
            )  # fmt: skip
            env["TREB_ATTEMPT"] = str(attempt)
            if self.local["path_prepend"]:
                env["PATH"] = base["PATH"]
            argv = list(p["argv"])
            if "MASTER_PORT" in p["env"]:
                env["MASTER_PORT"] = str(port)
            if self.jobfile["launcher"] == "torchrun" and "--master_port" in argv:
                argv[argv.index("--master_port") + 1] = str(port)
            # torchrun dies of USR1/USR2: it ignores them; its workers forward them
            launcher = p["rank"] is None and self.jobfile["launcher"] == "torchrun"
            one = Proc(Path(p["log"]).stem, p["label"], argv, env, p["rank"], p["node"],
                       p["local_rank"], record=record, launcher=launcher, cwd=p["cwd"])  # fmt: skip
            by_node.setdefault(p["node"], []).append(one)
        watch = self.watchdog.watch if self.watchdog else None
        forget = self.watchdog.forget if self.watchdog else None
        agents = [
            Agent(
                procs,
                str(adir),
                procs[0].cwd or ".",
                float(self.jobfile["grace"]),
                on_failure=self._on_failure,
                stopped_elsewhere=lambda p: self.job.stopped_by_warning(p.returncode),
                on_start=(lambda p: watch(cast(int, p.pid))) if watch else None,  # started
                on_end=(lambda p: forget(cast(int, p.pid))) if forget else None,  # ended
                cgroup=self.cgroup,
                # the watchdog and the cgroup end them if this process dies: no death signal
                # per rank (without a cgroup, a rank that left its group and cleared its
                # environment would be found by nothing else)
                watched=watch is not None and self.cgroup is not None,
            )  # fmt: skip
            for _, procs in sorted(by_node.items())
        ]
        for agent in agents:  # synced together by poll: per node, the same folder again
            agent.defer_sync = True
        return agents

    def _start(self, agents: list[Agent]) -> None:
        """Start every agent's processes, then tell the watchdog their groups at once."""
        for agent in agents:
            agent.start_all()
        if self.watchdog:
            self.watchdog.flush()

    def _run_hooks(self, when: str, adir: Path, attempt: int) -> bool:
        """The spec's pre/post command on every node, in parallel; False if one failed."""
        plans = self.local["hooks"].get(when)
        if not plans:
            return True
        agents = self._agents(plans, adir, attempt, self.port)
        for agent in agents:  # every node's command runs to its end; the first failure counts
            agent.stop_on_failure = False
            agent.on_failure = lambda p: self._on_failure(p, stop=False)
        self._start(agents)
        while any([agent.poll() for agent in agents]):
            if self.job.cancel_signal is not None:
                for agent in agents:
                    agent.kill(stopped=True)
            select.select([self.job.wake_r], [], [], 0.1)
            self.job.drain()
        sync([path for agent in agents for path in agent.take_unsynced()])
        ok = all(p.returncode == 0 for agent in agents for p in agent.procs)
        append_event(self.run_dir, f"{when}_hooks", attempt=attempt, ok=ok)
        if not ok and self.job.cancel_signal is None:  # a cancel ended it: not a failure
            self._say(f"{when} command failed on a node; see attempt-{attempt}/{when}-node-*.log")
        return ok

    def _announce_adopted(self) -> None:
        """Tell the watchdog about orphans adopted as subreaper: if the supervisor dies they
        go to init, and without a cgroup nothing else finds a daemon that cleared its env."""
        if not self.watchdog:
            return
        known = {p.pid for p in self.procs} | {self.watchdog.pid} | self._adopted
        known |= set(self.keepers.pids()) if self.keepers is not None else set()
        new = [pid for pid in children(os.getpid()) if pid not in known]
        for pid in new:
            self._adopted.add(pid)
            self.watchdog.adopt(pid, start_time(pid))
        if new:
            append_event(self.run_dir, "adopted", attempt=self.attempt, pids=new)

    def _say(self, text: str) -> None:
        """A launcher message on the attached terminal (detached runs have events.jsonl)."""
        if self.view:
            self.view.say(text)

    def _scan_again(self) -> bool:
        """Whether the run's end scans /proc for TREB_RUN_ID once more. Not when the last
        attempt's end (after) scanned already, nothing of the run started since (no post
        command) and the run has a cgroup, which holds whatever was started after that
        scan: reading every process's environment again cost a few ms of the run's end
        (~220 processes here; more on a desktop)."""
        started_since = bool(self.local["hooks"].get("post"))
        return self.cgroup is None or started_since or not self._scanned

    def _kill_strays(self, attempt: int, keep: bool = True, scan: bool = True) -> None:
        """Anything of this run still alive (a daemon a rank left behind) is killed now:
        the run's cgroup, what carries its TREB_RUN_ID (unless not `scan`), the orphans
        adopted as subreaper. `keep` keeps the cgroup for the next attempt. The
        supervisor's own helpers stay: the watchdog, the log policies' matcher, the
        webhooks' log watch."""
        me = os.getpid()
        matcher = self.job.matcher.pid if self.job.matcher is not None else None
        ours = {me, self.watchdog.pid if self.watchdog else -1, matcher or -1}
        ours |= set(self.job.notifier.pids()) if self.job.notifier is not None else set()
        adopted = []
        if self.subreaper:  # every child but ours: the ranks were reaped by now
            adopted = [p for p in children(me) if p not in ours and alive(p, None)]
        rid = self.jobfile["run_id"]
        found = contain.end_run(rid, str(self.run_dir), ours, keep=keep, scan=scan)
        self._scanned = scan
        tree = [q for p in adopted for q in [p, *descendants(p)]]
        for pid in tree:
            signal_pid(pid, signal.SIGKILL)
        if self.subreaper:
            reap([p for p in children(me) if p not in ours], timeout=1.0)
        strays = sorted({*found["cgroup"], *found["scan"], *tree})
        if strays:
            append_event(self.run_dir, "strays_killed", attempt=attempt, pids=strays)

    def _on_failure(self, p: Proc, stop: bool = True) -> None:
        """The first process of the attempt to fail (on any node) is the root cause: the
        controller records it and stops every node."""
        if self.job.failed:
            return
        adir = self.run_dir / f"attempt-{self.attempt}"
        cause: FirstFailure = {**p.outcome(), "log": str(adir / f"{p.name}.log")}
        if p.rank is None and self.jobfile["launcher"] in AGENT_LAUNCHERS:
            # An agent failed because a worker did: that worker is the cause.
            node = p.node if self.jobfile["launcher"] == "torchrun" else None
            cause = _workers_first(adir, node) or cause
        self.job.failure(cause, stop)


WORKER_RECORD_WAIT_S = 0.5


def _workers_first(adir: Path, node: int | None) -> FirstFailure | None:
    """The failed worker behind its launcher's failure, from the workers' records (each is
    written before its worker exits, so before its launcher can end on it): looked for again
    for up to WORKER_RECORD_WAIT_S, which only a launcher failing with no failed worker (its
    own bad start) waits out in full. (Two CI failures blamed on a late record were the rank
    that left first, stopped in its exit: rundir/records.left_first names it.)"""
    end = time.monotonic() + WORKER_RECORD_WAIT_S
    while (found := first_failure(rank_records(adir, node))) is None:
        if time.monotonic() >= end:
            return None
        time.sleep(0.05)
    return found


def keepers(job: JobFile) -> Keepers | None:
    """Keepers for runs that can lose a simulated node: more than one, or spares."""
    nodes, spares = int(job["nodes"]), int(job.get("spare_nodes", 0))
    if nodes < 2 and not spares:
        return None
    return Keepers(job["run_dir"], job["run_id"], names(nodes, spares), nodes,
                   job.get("min_nodes"), shrinks=job["launcher"] in SHRINKS)  # fmt: skip
