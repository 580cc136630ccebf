"""The node agent: starts the processes of one node (or one task) of an attempt and sees
them to their end.

Each process gets its own log (`attempt-<n>/<name>.log`, output written by the process
itself, so nothing is lost if the agent dies) and its own outcome record
(`attempt-<n>/<name>.json`: RUNNING when started, ENDED with exit code or signal). The first
process to fail is the root cause: the agent tells the engine (`on_failure`: on Slurm a
teardown marker and a TERM to the whole step) and stops the others (SIGTERM, then SIGKILL
after the grace period); those are recorded `stopped_by_launcher`, never as a cause.
TERM/HUP sent to the agent stop everything the same way; INT (Ctrl+C, or torchrun forwarding
it) is handed on as torchrun hands it on: SIGINT first (a Python rank's KeyboardInterrupt),
SIGTERM to what still runs after the grace period, SIGKILL after another; the checkpoint signals
(USR1/USR2) are forwarded, only to the processes that handle them (signal_all), or, on
Slurm, ignored (the controller delivers them by the same rule, task.deliver).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

from ..contracts import rank_env as contract
from ..process import contain, procs, unstarted
from ..rundir.records import exit_fields, now, read_json, sync, writable_fd, write_json
from ..watch.activity import Progress
from ..watch.paths import faulthandler_path, marks_path, metrics_config

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..contracts.schema import Outcome
    from ..watch.eta import Eta
    from ..watch.gpu import Sampler
    from ..watch.metric_reader import Metrics
    from ..watch.stacks import Stacks

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CHECKPOINT_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
# A command that died of one of these may have been stopped by the engine, not failed.
STOP_EXIT_CODES = (129, 130, 137, 143)
WATCH_AFTER_S = 1.0  # a silent run's watchers (GPUs, stacks) start this long after it


class Proc:
    """One process the agent starts: a rank, a node's launcher (torchrun, mpirun, the
    user's own under `none`) or a pre/post command."""

    def __init__(
        self,
        name: str,
        label: str,
        argv: list[str],
        env: dict[str, str],
        rank: int | None = None,
        node: int = 0,
        local_rank: int | None = None,
        record: bool = True,
        launcher: bool = False,
        cwd: str | None = None,
    ) -> None:
        self.name = name  # file stem: rank-3, node-1, pre-node-0
        self.label = label  # as `treb status` shows it: node:local, or node
        self.argv = argv
        self.env = env
        self.rank = rank
        self.node = node
        self.local_rank = local_rank
        self.record = record  # pre/post commands: their log is their record
        self.launcher = launcher  # torchrun/mpirun: ignores the checkpoint signals itself
        self.cwd = cwd  # None: the agent's
        self.popen: subprocess.Popen[bytes] | None = None
        self.started_at = now()
        self.ended_at: float | None = None
        self.returncode: int | None = None
        self.stopped = False
        self.after_peer = False  # its failure says another rank's came first (a cascade)

    @property
    def tracked(self) -> bool:
        """Its progress is followed and its stacks dumped: a rank, or the user's own
        command under launcher none (not torchrun/mpirun, nor a pre/post command)."""
        return self.record and not self.launcher

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.returncode is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def exit_code(self) -> int | None:
        return None if self.returncode is None else exit_fields(self.returncode)[0]

    def outcome(self) -> Outcome:
        """What its record and the run store say about it."""
        code, sig = (None, None) if self.returncode is None else exit_fields(self.returncode)
        out: Outcome = {
            "label": self.label,
            "rank": self.rank,
            "node": self.node,
            "local_rank": self.local_rank,
            "pid": self.pid,
            "exit_code": code,
            "signal": sig,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "stopped_by_launcher": self.stopped,
        }
        if self.after_peer:
            out["after_peer"] = True
        return out


class Agent:
    """The processes of one node or task, from start to the last one's end."""

    def __init__(
        self,
        procs_: list[Proc],
        attempt_dir: str,
        cwd: str,
        grace: float,
        forward_term: bool = True,
        engine_delivers_checkpoint: bool = False,
        extra: dict[str, Any] | None = None,
        on_failure: Callable[[Proc], None] | None = None,
        stopped_elsewhere: Callable[[Proc], bool] | None = None,
        on_start: Callable[[Proc], None] | None = None,
        on_end: Callable[[Proc], None] | None = None,
        cgroup: str | None = None,
        watched: bool = False,
    ) -> None:
        self.procs = procs_
        self.adir = attempt_dir
        self.cwd = cwd
        self.grace = grace
        self.forward_term = forward_term  # False where the engine signals every process
        self.engine_delivers_checkpoint = engine_delivers_checkpoint
        self.extra = extra or {}  # host, job id, attempt: copied into every record
        self.on_failure = on_failure
        self.stopped_elsewhere = stopped_elsewhere
        self.on_start = on_start  # e.g. the local watchdog learns each pid
        self.on_end = on_end  # and forgets it once its group is gone (the id may be reused)
        self.cgroup = cgroup  # the run's cgroup v2 (contain.py): its processes start in it
        # True where a watchdog outside this process ends its processes if it dies (the
        # local supervisor's, launcher/watchdog.py): no parent-death signal, so no setpriv
        # exec per rank (~0.8 ms of CPU each)
        self.watched = watched
        self.contained = True  # False while the move into `cgroup` failed (start_all)
        self.stop_on_failure = True  # pre/post commands: every node's runs to its end
        self.first_failure: Proc | None = None
        self.kill_at: float | None = None
        self.term_at: float | None = None  # an interrupt's SIGTERM step (teardown)
        self._unsynced: list[str] = []  # ENDED records not yet fsynced (sync_records)
        # True where the caller syncs the records once all have ended (take_unsynced): the
        # local supervisor, all its agents' at once; a parked Slurm node agent, after its
        # word to the controller (runtime/node/task.py)
        self.defer_sync = False
        self._stop: int | None = None  # the stop signal this agent received
        self._forward: list[int] = []
        self._wake_r = -1
        self.progress = Progress(attempt_dir, self._first_line)  # its hooks: _watch
        self.marks_made = False  # attempt-<n>/marks, made at the first tracked start
        # What watches the processes once they run, made by _watch after their start: its
        # modules (regexes, parsers) are no part of a rank's start (issue 36)
        self.watching = False
        self.watch_at: float | None = None  # set at the first start or poll
        self.metrics: Metrics | None = None
        self.eta: Eta | None = None
        self.gpus: Sampler | None = None
        self.stacks: Stacks | None = None

    def _first_line(self, name: str, line: bytes) -> None:
        """The first line a process printed: the watchers now, then the line to them."""
        self._watch()
        if self.progress.on_line is not None:
            self.progress.on_line(name, line)

    def _watch(self, conf: dict[str, Any] | None = None) -> None:
        """The watchers of the run's lines, GPUs and stack requests, once: at the first
        line, or WATCH_AFTER_S after the start (a run that prints nothing still has its GPUs
        sampled and its stacks answered); at the start where the run asks for GPUs (start_all:
        sampled from the start, a run that ends within the second too). A CPU run that ends
        sooner, silent, never imports their modules (~4 ms of regexes: a 2-rank launch's
        ratio to torchrun). `conf`: the run's metrics.json, where read already."""
        if self.watching:
            return
        from ..watch import eta, gpu
        from ..watch import metric_reader as metrics
        from ..watch.marks import chain, checkpoint_lines
        from ..watch.stacks import Stacks

        self.watching = True
        conf = conf or metrics.read_config(self.adir) or {}  # the run's metrics.json
        self.metrics = metrics.hook(self.adir, conf)  # fed by the one reader's lines
        self.eta = eta.hook(self.adir, conf)  # the first rank's progress, from them too
        self.gpus = gpu.sampler(self.adir, conf, self.procs)  # the node's GPUs, if asked for
        checkpoints = checkpoint_lines(self.adir, conf)  # `Saving model checkpoint to`
        self.progress.on_line = eta.chain(self.eta, chain(self.metrics, checkpoints))
        self.stacks = Stacks(self.adir)

    # -- signals (a standalone agent; in the local supervisor, the supervisor has them) ---
    def install_signals(self) -> None:
        self._wake_r, wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(wake_w, False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_stop)
        for sig in CHECKPOINT_SIGNALS:
            if self.engine_delivers_checkpoint:
                signal.signal(sig, signal.SIG_IGN)  # the processes get it from the engine
            else:
                signal.signal(sig, self._on_forward)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)

    def _on_stop(self, signum: int, _frame: object) -> None:
        self._stop = signum if self._stop in (None, signal.SIGINT) else self._stop

    def stop_requested(self) -> bool:
        """A stop signal came and no poll took it yet (before the start: none starts)."""
        return self._stop is not None

    def _on_forward(self, signum: int, _frame: object) -> None:
        self._forward.append(signum)

    # -- the processes -------------------------------------------------------------------
    def _preexec(self, p: Proc) -> Callable[[], None]:
        def setup() -> None:
            procs.die_with_parent()
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            # torchrun dies of USR1/USR2 (it handles TERM, INT, HUP, QUIT only): it ignores
            # them, and each worker's own agent restores them for the command.
            disposition = signal.SIG_IGN if p.launcher else signal.SIG_DFL
            for sig in CHECKPOINT_SIGNALS:
                signal.signal(sig, disposition)

        return setup

    @staticmethod
    def _signals_ignored() -> bool:
        """Whether this process ignores a stop or checkpoint signal: exec keeps SIG_IGN
        (handled ones become SIG_DFL), so its processes need a preexec_fn to reset it."""
        return any(
            signal.getsignal(sig) == signal.SIG_IGN for sig in STOP_SIGNALS + CHECKPOINT_SIGNALS
        )

    def _plain_start(self, p: Proc, ignored: bool) -> list[str] | None:
        """The argv for a start without preexec_fn, or None when one is needed: a launcher
        (torchrun ignores the checkpoint signals), a signal this process ignores
        (`ignored`), or no setpriv for the death signal where no watchdog and cgroup stand
        in (not `watched`, or the move into the cgroup failed)."""
        if p.launcher or ignored:
            return None
        return p.argv if self.watched and self.contained else procs.with_pdeathsig(p.argv)

    def start(self, p: Proc, ignored: bool = False, stdin: int = subprocess.DEVNULL) -> None:
        """Start one process; its record is the caller's to write (start_all). `stdin`: an
        fd of /dev/null opened once for all, or Popen opens and closes one per process."""
        log = os.path.join(self.adir, p.name + ".log")
        fd = writable_fd(log)  # a regular file: an earlier rank may have put a FIFO there
        if p.tracked:  # the contract's per-rank paths (trebuchet.dist.heartbeat/enable_stacks)
            p.env["TREB_HEARTBEAT"] = self.progress.track(p.name)
            p.env["TREB_STACKS_FILE"] = faulthandler_path(self.adir, p.name)
            p.env["TREB_MARKS"] = marks_path(self.adir, p.name)  # trebuchet.dist.mark
            if not self.marks_made:
                os.makedirs(os.path.dirname(p.env["TREB_MARKS"]), mode=0o700, exist_ok=True)
                self.marks_made = True
            elastic = contract.attempt_elastic_vars(p.env, self.adir, p.name)
            if elastic:  # torch's @record opens the file, in a folder that must exist
                folder = os.path.dirname(elastic["TORCHELASTIC_ERROR_FILE"])
                os.makedirs(folder, mode=0o700, exist_ok=True)
                p.env.update(elastic)
        argv = self._plain_start(p, ignored)
        try:
            wrapped = argv is not None and argv is not p.argv  # setpriv execs the command
            cannot = wrapped and procs.exec_error(p.argv[0], p.env.get("PATH"), self.cwd)
            if cannot:
                raise cannot
            p.popen = subprocess.Popen(
                argv or p.argv,
                env=p.env,
                cwd=self.cwd,
                stdin=stdin,
                stdout=fd,
                stderr=fd,
                start_new_session=True,
                preexec_fn=None if argv else self._preexec(p),
                close_fds=True,
            )
        except OSError as exc:  # a missing launcher is named, with PATH (unstarted.py)
            os.write(fd, unstarted.line(p.argv[0], exc, p.env.get("PATH"), p.node).encode())
            p.returncode, p.ended_at = 127, now()
        finally:
            os.close(fd)
        p.started_at = now()
        if p.popen and self.on_start:
            self.on_start(p)

    def write_record(self, p: Proc) -> None:
        if not p.record:
            return
        state = "RUNNING" if p.returncode is None else "ENDED"
        log = os.path.join(self.adir, p.name + ".log")
        path = os.path.join(self.adir, p.name + ".json")
        write_json(path, {**self.extra, **p.outcome(), "state": state, "log": log},
                   durable=False)  # fmt: skip
        if state == "ENDED":  # RUNNING is replaced within the run: never synced
            self._unsynced.append(path)

    def sync_records(self) -> None:
        """Make the ENDED records written so far durable, all at once: fsyncs issued after
        all are written cost a fraction of one fsync per record as it is written (here, 32
        records: ~3 ms instead of ~15 ms idle; on a busy machine the inline fsyncs took
        ~300 ms, during which nothing was reaped). Called for the first failure (the root
        cause is on disk at once) and when the last process has ended."""
        sync(self.take_unsynced())

    def defer(self, path: str) -> None:
        """A file of this node written with durable=False (its health record), made
        durable with its ENDED records."""
        self._unsynced.append(path)

    def take_unsynced(self) -> list[str]:
        """The ENDED records written and not yet synced (for the caller to sync)."""
        paths, self._unsynced = self._unsynced, []
        return paths

    def teardown(self, first: int = signal.SIGTERM) -> None:
        """SIGTERM every live process group (unless the engine does), SIGKILL after the
        grace. `first` SIGINT (an interrupt, as torchrun delivers Ctrl+C: its
        PContext.close(SIGINT) signals each worker's group): SIGINT now, the SIGTERM after
        the grace period to what still runs, the SIGKILL after another one."""
        interrupt = first == signal.SIGINT and self.kill_at is None
        sig = signal.SIGINT if interrupt else signal.SIGTERM
        for p in self.procs:
            if p.alive:
                p.stopped = True
                # an interrupt's signals are always the agent's: an engine that signals every
                # process (Slurm's TERM, forward_term False) hands the agent alone its INT
                if (self.forward_term or interrupt) and p.popen:
                    procs.signal_group(p.popen.pid, sig)
        if interrupt:
            self.term_at = time.monotonic() + self.grace
            self.kill_at = self.term_at + self.grace
        elif self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace
        else:  # a SIGTERM now (a second stop): no SIGTERM step left to wait for
            self.term_at = None

    def _reap(self) -> None:
        for p in self.procs:
            if not p.alive or p.popen is None or p.popen.poll() is None:
                continue
            p.returncode, p.ended_at = p.popen.returncode, now()
            procs.signal_group(p.popen.pid, signal.SIGKILL)  # leftovers of its group
            if self.on_end:
                self.on_end(p)
            if p.returncode != 0 and not p.stopped and self.stopped_elsewhere:
                p.stopped = self.stopped_elsewhere(p)
            self.write_record(p)
            if p.returncode != 0 and not p.stopped and self.first_failure is None:
                self.first_failure = p
                self.sync_records()
                if self.on_failure:
                    self.on_failure(p)
                if self.stop_on_failure:
                    self.teardown()

    def start_all(self) -> None:
        """Start every process (inside the run's cgroup, if any), then write their records.
        The loop only starts them: each process started competes with it for the CPU, so
        whatever else it did per process delayed the later starts several times over. One
        that cannot even start is the first failure."""
        ignored = self._signals_ignored()
        devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with contain.inside(self.cgroup) as self.contained:
                for p in self.procs:
                    self.start(p, ignored, devnull)
                    if p.returncode is not None and self.first_failure is None:
                        self.first_failure = p
                        if self.on_failure:
                            self.on_failure(p)
        finally:
            os.close(devnull)
        for p in self.procs:
            self.write_record(p)
        self.watch_at = time.monotonic() + WATCH_AFTER_S
        conf = read_json(metrics_config(self.adir))  # a json read: no watcher's module
        if isinstance(conf, dict) and conf.get("gpus"):  # GPUs asked for (watch/gpu.wanted)
            self._watch(conf)
        if self.first_failure and self.stop_on_failure:
            self.teardown()

    def poll(self) -> bool:
        """One step: reap, stop on request, forward signals, SIGKILL after the grace;
        then the bounded rest (progress at most once a second, a stacks request).
        True while a process is alive."""
        self._reap()
        if self._stop is not None:
            first, self._stop = self._stop, None
            self.teardown(first)
        while self._forward:
            self.signal_all(self._forward.pop(0))
        if self.term_at is not None and time.monotonic() >= self.term_at:
            self.term_at = None
            for p in self.procs:  # the interrupt's SIGTERM step: the agent's own
                if p.alive and p.popen:
                    procs.signal_group(p.popen.pid, signal.SIGTERM)
        if self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.kill()
        alive = any(p.alive for p in self.procs)
        if not self.watching:
            if self.watch_at is None:  # processes started one by one (start), not start_all
                self.watch_at = time.monotonic() + WATCH_AFTER_S
            elif time.monotonic() >= self.watch_at:
                self._watch()
        self.progress.step(force=not alive)  # all ended: their last lines now
        if self.eta is not None:
            self.eta.flush()  # the reading of that step, if it changed
        if self.gpus is not None:
            self.gpus.step() if alive else self.gpus.close()  # never waits for the query
        live = {p.name: p.pid for p in self.procs if p.tracked and p.alive and p.pid}
        if self.stacks is not None:
            self.stacks.step(live)
        if not alive:
            if not self.defer_sync:
                self.sync_records()
            if self.stacks is not None:
                self.stacks.close()
            if self.metrics is not None:
                self.metrics.close()
        return alive

    def signal_all(self, sig: int) -> list[int]:
        """The checkpoint signal (or a forwarded USR1/USR2) to the processes that handle it,
        the topmost in each process's tree (procs.catchers): never to one that would die
        of it, nor to a whole group (a data loader's workers). The pids it reached."""
        sent: list[int] = []
        for p in self.procs:
            if p.alive and p.popen:
                sent += [
                    pid for pid in procs.catchers(p.popen.pid, sig) if procs.signal_pid(pid, sig)
                ]
        return sent

    def kill(self, stopped: bool = False) -> None:
        """SIGKILL every live process group now."""
        for p in self.procs:
            if p.alive and p.popen:
                p.stopped = p.stopped or stopped
                procs.signal_group(p.popen.pid, signal.SIGKILL)

    def run(self, tick: Callable[[], None] | None = None) -> int:
        """Start every process, wait for all; the exit code of the first failure, else of
        the first process that did not succeed, else 0. `tick` runs after each poll (the
        node verb's timeout)."""
        self.start_all()
        while self.poll():
            if tick:
                tick()
            select.select([self._wake_r] if self._wake_r >= 0 else [], [], [], 0.2)
            self._drain()
        return self.exit_code()

    def exit_code(self) -> int:
        if self.first_failure is not None:
            return self.first_failure.exit_code or 1
        return next((p.exit_code for p in self.procs if p.exit_code), 0) or 0

    def _drain(self) -> None:
        if self._wake_r < 0:
            return
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass
