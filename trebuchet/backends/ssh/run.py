"""The ssh engine's supervisor: one run's sessions to its hosts, driven by the one job
controller (runtime/job/life.py) as its Nodes. `python -m trebuchet.backends.ssh.run
RUN_DIR` is a detached run's supervisor.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from trebuchet.runtime.contracts.schema import FirstFailure, JobFile
from trebuchet.runtime.job import nodeloss, nodeset
from trebuchet.runtime.job.life import Ending, JobController, settings
from trebuchet.runtime.job.link import NODE_TIMEOUT_S
from trebuchet.runtime.node import barrier, health
from trebuchet.runtime.rundir.records import attempt_logs, cause
from trebuchet.runtime.watch.hung import expected_names
from trebuchet.store import lifecycle

if TYPE_CHECKING:
    from trebuchet.store.db import Store
    from trebuchet.view.live import View
from trebuchet.backends.ssh.hosts import Hosts
from trebuchet.backends.ssh.nodes import (
    LOST,
    STALL_S,
    Node,
    fetch,
    merge_hang,
    outcome,
    process_records,
    setup_text,
)
from trebuchet.backends.ssh.script import (
    SETUP_FAILED,
    SshFacts,
    attempt_hosts,
    master_address,
    node_script,
    place,
    remote_command,
)

_LABEL = re.compile(rb"\[(\d+)(?::(\d+))?\] ")


class SshRun:
    """The supervisor of one ssh run (attached or detached)."""

    def __init__(self, run_dir: Path, store: Store, view: View | None = None) -> None:
        from trebuchet.launcher.index_records import IndexRecords
        from trebuchet.store.files import read_json

        self.run_dir = run_dir
        self.jobfile = cast(JobFile, read_json(run_dir / "job.json"))  # contracts.JobFile
        self.info = cast(SshFacts, read_json(run_dir / "ssh.json"))  # this engine's facts
        self.hosts = Hosts(self.info, run_dir, lambda: self.cancelled, self.nap, self.say)
        self.store = store
        self.view = view
        self.rid = self.info["run_id"]
        self.notes: list[str] = []  # said by the main loop (reader threads append)
        self.nodes: list[Node] = []  # this attempt's sessions, one per host
        self.first: Node | None = None  # the first node to end badly: the root cause's
        self.kill_at: float | None = None  # sessions that did not end by then are cut
        self.cancel_said = False
        self.stopping = False  # the attempt is being stopped: nodes that end now are no cause
        self.clock_start = time.monotonic()  # the attempt's start, as the controller's clock
        self.idle = False  # nothing started (the time ran out in `pre`): alive until stopped
        self.active: list[str] = attempt_hosts(self.info)  # this attempt's hosts, node 0 first
        self.last_poll = time.monotonic()  # a stalled supervisor heard nobody: not their fault
        self.gate = threading.Lock()  # the go (barrier.py) and the stop: one at a time
        self.go_sent = False  # this attempt's agents were told to start their ranks
        self.records = IndexRecords(store, self.rid, run_dir, self.say)
        self.job = JobController(settings(self.jobfile), self, self.records)

    @property
    def cancel_signal(self) -> int | None:
        return self.job.cancel_signal

    # -- signals, messages ---------------------------------------------------------------
    def install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_cancel)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.job.wake_w, warn_on_full_buffer=False)

    def _on_cancel(self, signum: int, _frame: object) -> None:
        self.job.cancel(signum)

    def say(self, text: str) -> None:
        from trebuchet.store.files import append_event

        append_event(self.run_dir, "ssh", message=text)
        if self.view:
            self.view.say(text)

    def nap(self, seconds: float) -> None:
        """Sleep up to `seconds`, woken by a signal (a cancel, a child's end)."""
        with contextlib.suppress(InterruptedError, OSError, ValueError):
            select.select([self.job.wake_r], [], [], max(0.0, seconds))
        self.job.drain()

    @property
    def cancelled(self) -> bool:
        return self.job.cancel_signal is not None

    # -- the run -------------------------------------------------------------------------
    def run(self) -> str:
        from trebuchet.store.lifecycle import run_started

        run_started(self.store, self.rid)
        self.hosts.control = tempfile.mkdtemp(prefix="treb-ssh-")
        try:
            return self.job.run()
        finally:
            self.hosts.disconnect()

    # -- Nodes (runtime/job/life.py): this engine's side of each attempt -----------------
    def prepare(self) -> FirstFailure | None:
        """Connections to every host, then the run's files where they are not shared. A
        cancel meanwhile stops there: the first attempt then starts nothing."""
        from trebuchet.store.files import write_json

        t0 = time.time()
        why = self.hosts.connect()
        if why is None and not self.cancelled:
            shared = self.hosts.shared()
            if not self.cancelled:
                place(self.info, shared)
                write_json(self.run_dir / "ssh.json", self.info)  # where the files are
                why = None if shared else self.hosts.copy()
                if shared:
                    self.say("run directory shared with every host: nothing copied")
        if self.cancelled:
            self.say("cancelled while connecting to the hosts: nothing was started")
            return None
        if why is None:
            return None
        self.say(why)
        self.store.set_attempt(self.rid, 0, state="FAILED", started_at=t0, ended_at=time.time(),
                               reason=why)  # fmt: skip
        return cause("ssh", 255, 0, message=why)

    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        # asked as the attempt starts: the controller's clock starts here too (the sessions'
        # timeout, the agents' elapsed time count from it)
        self.clock_start = time.monotonic()
        self.idle = False
        if attempt:
            self.choose_hosts()
        return {"master": f"{self.info['master_addr']}:{self.info['master_port']}",
                "hosts": self.active}  # fmt: skip

    def choose_hosts(self) -> None:
        """After a lost node: the held hosts not excluded (runtime/job/nodeset.py), NODE_RANK
        by their order, the master node 0's."""
        info = self.info
        before = self.active
        choice = self.next_nodes()
        self.active = info["active"] = choice.hosts
        if not self.active or self.active == before:
            return
        if self.active[0] != before[0]:
            info["master_addr"] = master_address(info)
        shape = self.job.settings.shape
        self.job.settings = self.job.settings._replace(shape=(shape[0], len(self.active),
                                                              shape[2]))  # fmt: skip
        world = len(self.active) * int(self.jobfile["ppn"])
        self.say(
            f"nodes now: {', '.join(self.active)} (MASTER_ADDR {info['master_addr']}, "
            f"WORLD_SIZE {world}; excluded: {', '.join(nodeset.excluded(str(self.run_dir)))})"
        )

    def next_nodes(self) -> nodeset.Choice:
        hosts = self.info["hosts"]
        want = int(self.info.get("nodes") or len(hosts))
        return nodeloss.next_nodes(str(self.run_dir), hosts, want, self.jobfile.get("min_nodes"))

    def deadline(self) -> float | None:
        timeout = self.jobfile.get("timeout")
        return self.clock_start + float(timeout) if timeout else None

    def pre_post(self, when: str, attempt: int) -> bool:
        """The spec's pre/post command on every host at once, each node's to its end (as
        locally); False when one failed. A cancel ends them (on the hosts too); so does the
        attempt's timeout during `pre`, which then starts nothing."""
        command = str(self.jobfile.get(when) or "")  # pre or post
        if not command or self.cancelled:
            return True
        adir = self.run_dir / f"attempt-{attempt}"
        sessions = []
        for i, host in enumerate(self.active):
            log = open(adir / f"{when}-node-{i}.log", "ab")  # noqa: SIM115 - closed below
            script = node_script(self.info, i, attempt, command)
            sessions.append(self.open_session(i, host, script, log, adir, None))
        why = self.wait_sessions(sessions, self.deadline() if when == "pre" else None)
        for n in sessions:
            if n.reader:
                n.reader.join(10)
            n.log.close()
        ok = why is None and all(n.returncode == 0 for n in sessions)
        self.records.event(f"{when}_hooks", attempt=attempt, ok=ok,
                           **({"stopped": why} if why else {}))  # fmt: skip
        for n in sessions:
            if n.setup_failed and why is None:
                self.say(f"node {n.index} ({n.host}): before `{when}`: {setup_text(self.info, n)}")
        if why == "timeout":
            self.say(f"the attempt's timeout came during `{when}`: its ranks do not start")
            self.idle = True
            return True
        if not ok and why is None:
            self.say(f"{when} command failed on a node; see attempt-{attempt}/{when}-node-*.log")
        return ok or why is not None

    def wait_sessions(self, sessions: list[Node], deadline: float | None) -> str | None:
        """Until every session ended; why they were stopped ("cancel", "timeout")."""
        why: str | None = None
        kill_at: float | None = None
        while True:
            for n in sessions:
                if n.returncode is None and n.proc.poll() is not None:
                    n.returncode = n.proc.returncode
            if all(n.returncode is not None for n in sessions):
                return why
            now = time.monotonic()
            if why is None and self.cancelled:
                why = "cancel"
            if why is None and deadline is not None and now >= deadline:
                why = "timeout"
            if why is not None:
                self.stop_remote(sessions, "TERM")
                if kill_at is None:
                    kill_at = now + float(self.jobfile["grace"]) + 15
                if self.job.force_kill or now > kill_at:
                    self.cut(sessions)
            self.nap(0.2 if why or deadline is None else min(0.2, deadline - now))

    def start(self, attempt: int) -> None:
        adir = self.run_dir / f"attempt-{attempt}"
        self.first, self.kill_at, self.cancel_said, self.stopping = None, None, False, False
        self.go_sent = False
        if self.cancelled or self.idle:  # cancelled before, or the time ran out in `pre`:
            self.nodes = []  # nothing starts; the controller ends the attempt
            return
        elapsed = time.monotonic() - self.clock_start
        secrets = {n: os.environ.get(n, "") for n in self.jobfile["secrets"]}
        line = json.dumps(secrets).encode() + b"\n"
        self.nodes = []
        nodes = []  # the go waits for all of them (release): the list is whole or empty
        for i, host in enumerate(self.active):
            log = open(adir / f"ssh-{i}.log", "ab")  # noqa: SIM115 - closed by after()
            script = node_script(self.info, i, attempt, elapsed=elapsed)
            nodes.append(self.open_session(i, host, script, log, adir, line))
        with self.gate:
            self.nodes = nodes
        self.release()
        if self.view:
            ppn = int(self.jobfile["ppn"])
            for i in range(len(self.nodes)):
                for local in range(ppn):
                    self.view.add(f"{i}:{local}", adir / f"rank-{i * ppn + local}.log")

    def poll(self) -> bool:
        """A node that ends badly first names the root cause's node. Nothing started (the
        time ran out in `pre`): running until the controller stops the attempt."""
        for n in self.nodes:
            if n.returncode is None and n.proc.poll() is not None:
                if n.reader:  # its last lines (a setup's failure) are in once it is done
                    n.reader.join(5)
                n.returncode = n.proc.returncode
                if (n.returncode != 0 or n.lost) and self.first is None and not self.stopping \
                        and not self.cancelled:  # fmt: skip
                    self.first = n
                    if n.lost:
                        rc = n.returncode
                        what = (
                            f"the ssh connection to {n.host} was lost (ssh exit {rc})"
                            if rc == 255 or rc < 0
                            else f"its node agent ended without its last word (ssh exit {rc})"
                        )
                        self.lose(n, nodeloss.dropped(n.host, what), time.time())
                        continue
                    if n.setup_failed is not None:
                        self.say(f"node {n.index} ({n.host}): {setup_text(self.info, n)}")
                        for out in n.setup_output:
                            self.say(f"  {n.host}: {out}")
                        self.say("stopping the others")
                    else:
                        what = LOST if n.lost else f"node agent exited {n.returncode}"
                        self.say(f"node {n.index} ({n.host}): {what}: stopping the others")
                    self.job.failure(None)  # its record comes with the attempt's folder
        self.release()
        self.watch_beats()
        return any(n.returncode is None for n in self.nodes) or (self.idle and not self.stopping)

    def release(self) -> None:
        """Every node's checks passed (barrier.py): the go to all of them at once, so that
        no rank starts while another node still checks."""
        with self.gate:
            if self.go_sent or self.stopping or self.first is not None or not self.nodes:
                return
            if not all(n.healthy and n.returncode is None for n in self.nodes):
                return
            self.go_sent = True
            for n in self.nodes:
                n.send(f"{barrier.GO}\n".encode())

    def watch_beats(self) -> None:
        """A node whose agent said nothing (not even its heartbeat) for node_timeout is lost:
        ssh's own keepalive would take far longer to say so."""
        now = time.monotonic()
        if now - self.last_poll > STALL_S:  # this process was stopped: the lines wait unread
            for n in self.nodes:
                n.heard = max(n.heard, now)
        self.last_poll = now
        if self.first is not None or self.stopping or self.cancelled:
            return
        timeout = float(self.jobfile.get("node_timeout") or NODE_TIMEOUT_S)
        for n in self.nodes:
            if n.returncode is None and n.setup_done and n.ended is None \
                    and now - n.heard > timeout:  # fmt: skip
                self.first = n
                self.lose(n, nodeloss.silent(n.host, timeout, n.heard_wall), n.heard_wall)
                return

    def lose(self, n: Node, message: str, last_seen: float) -> None:
        """Node `n` is lost: on record, excluded from this run, its session cut here (its host
        answers nothing), the others stopped."""
        n.lost_cause = nodeloss.record(str(self.run_dir), self.job.attempt, n.index, n.host,
                                       message, last_seen)  # fmt: skip
        self.say(f"{message}: stopping the others")
        if n.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(n.proc.pid, signal.SIGKILL)
        self.job.failure(n.lost_cause)

    def checkpoint(self, signum: int) -> int:
        return 0  # the node agents hold the timeout's warning themselves

    def stop(self) -> None:
        """Close every session; one still in setup is ended on its host; one still open after
        the grace period and 15 s is cut."""
        with self.gate:  # no go after this: the waiting agents end without their ranks
            self.stopping = True
        if self.cancelled and not self.cancel_said:
            self.cancel_said = True
            self.say("cancelling: closing every host's session")
        interrupt = self.job.cancel_signal == signal.SIGINT and not self.job.failed
        for n in self.nodes:
            n.close_session(interrupt)
        self.stop_remote(self.nodes, "TERM")
        if self.kill_at is None:  # an interrupt: SIGTERM after one grace, SIGKILL after two
            grace = float(self.jobfile["grace"]) * (2 if interrupt else 1)
            self.kill_at = time.monotonic() + grace + 15

    def stop_remote(self, sessions: list[Node], sig: str) -> None:
        """`sig` to the process group of each session no agent took over yet, on its host;
        once per session and signal (one that has not said its group yet gets it in tick)."""
        for n in sessions:
            if n.returncode is not None or n.pgid is None or sig in n.signalled:
                continue
            if n.setup_done and not n.hook:
                continue  # the agent: its closed stdin stops it, with the grace period
            n.signalled.add(sig)
            cmd = remote_command(f"kill -{sig} -- -{n.pgid} 2>/dev/null; true")
            self.hosts.remote_stops.append(subprocess.Popen(
                self.hosts.ssh(n.host, cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))  # fmt: skip

    def cut(self, sessions: list[Node]) -> None:
        """SIGKILL on the hosts (what no agent runs yet) and to the ssh clients here (an
        agent then sees its stdin end)."""
        self.stop_remote(sessions, "KILL")
        for n in sessions:
            if n.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(n.proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        self.cut(self.nodes)

    def tick(self) -> None:
        if self.stopping:  # a session that said its group after the stop
            self.stop_remote(self.nodes, "TERM")
        if self.kill_at is not None and time.monotonic() > self.kill_at:
            self.kill()
        self.hosts.remote_stops = [p for p in self.hosts.remote_stops if p.poll() is None]
        while self.notes:
            self.say(self.notes.pop(0))

    def after(self, attempt: int, reason: str | None) -> None:
        adir = self.run_dir / f"attempt-{attempt}"
        for n in self.nodes:
            if n.reader:
                n.reader.join(10)
            n.close_session()
            n.log.close()
            if self.info["remote_root"] is not None and not n.lost:
                note = fetch(self.hosts, n, adir)
                if note:
                    self.notes.append(note)
        by_index = {n.index: n.host for n in self.nodes}  # an unhealthy node: not used again
        health.exclude_recorded(
            str(self.run_dir),
            str(adir),
            [by_index.get(i, "") for i in range(max(by_index, default=-1) + 1)],
        )
        while self.notes:
            self.say(self.notes.pop(0))

    def ending(self, attempt: int, reason: str | None) -> Ending:
        adir = self.run_dir / f"attempt-{attempt}"
        hung = reason == "failure" and merge_hang(adir, expected_names(*self.job.settings.shape))
        records = process_records(adir, self.active)
        self.store.set_procs(self.rid, attempt, records)
        horovod = self.jobfile["launcher"] == "horovod"  # node 0's horovodrun ran them all
        state, found = outcome(self.info, records, self.first, reason, adir, attempt, hung,
                               horovod)  # fmt: skip
        if found is not None:  # the cause the controller holds stays (the first one given)
            self.job.settle(found)
        lost = self.first.lost_cause if self.first is not None else None
        if state == "FAILED" and (lost is not None or nodeset.excluded(str(self.run_dir))):
            why = str(lost.get("message") or nodeloss.LABEL) if lost is not None else reason
            left = self.next_nodes()
            if left.why_not:  # a lost or unhealthy node, and too few left: no next attempt
                self.say(f"no spare to go on with: {left.why_not}")
                return Ending("FAILED", why, final=True)
            if lost is not None:
                return Ending("FAILED", why)
        if hung and found is None and state == "FAILED":
            return Ending(state, "hang", hung=True)
        return Ending(state, reason)

    def logs(self, attempt: int, cause: FirstFailure | None) -> list[str]:
        return attempt_logs(str(self.run_dir / f"attempt-{attempt}"), (cause or {}).get("log"))

    def exit_code(self) -> int:
        return 0

    def requeue(self) -> None:
        raise AssertionError("ssh hosts have no time limit of their own")

    def open_session(self, i: int, host: str, script: str, log: IO[bytes], adir: Path,
                     stdin_line: bytes | None) -> Node:  # fmt: skip
        """`bash -c script` on `host`; `stdin_line` (the agent's secrets) first on its stdin,
        which stays open as the agent's lifeline. None: a pre/post command."""
        proc = subprocess.Popen(
            self.hosts.ssh(host, remote_command(script)),
            stdin=subprocess.PIPE if stdin_line is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        node = Node(i, host, proc, log, hook=stdin_line is None)
        if stdin_line is not None:
            assert proc.stdin is not None
            try:
                proc.stdin.write(stdin_line)
                proc.stdin.flush()
            except OSError:
                pass  # the session is already gone: its exit code says so
        node.reader = threading.Thread(target=self.read, args=(node, adir), daemon=True)
        node.reader.start()
        return node

    def read(self, node: Node, adir: Path) -> None:
        """The session's stdout: the agent's labelled lines to the ranks' logs (unless they
        write the shared run directory themselves), the rest to ssh-<node>.log and the
        terminal."""
        copy = self.info["remote_root"] is not None
        ppn = int(self.jobfile["ppn"])
        files: dict[str, IO[bytes]] = {}
        assert node.proc.stdout is not None
        try:
            for line in node.proc.stdout:
                if not node.setup_done and node.marker(line):
                    if node.setup_failed is not None and line.startswith(SETUP_FAILED.encode()):
                        node.log.write(f"treb: {setup_text(self.info, node)}\n".encode())
                        node.log.flush()
                    continue
                if node.hook:
                    node.log.write(line)
                    node.log.flush()
                    continue
                if node.hear(line):
                    if node.healthy and not self.go_sent:
                        self.release()
                    continue
                m = _LABEL.match(line)
                if not m:
                    node.log.write(line)
                    node.log.flush()
                    self.notes.append(f"{node.host}: {line.decode(errors='replace').rstrip()}")
                    continue
                if not copy:
                    continue
                n, local = int(m.group(1)), m.group(2)
                name = f"rank-{n * ppn + int(local)}" if local is not None else f"node-{n}"
                if name not in files:
                    files[name] = open(adir / f"{name}.log", "ab")  # noqa: SIM115 - below
                fh = files[name]
                fh.write(line[m.end() :])
                fh.flush()
        finally:
            for fh in files.values():
                fh.close()


def main(argv: list[str]) -> int:
    """A detached run's supervisor."""
    from trebuchet.store.db import Store

    store = Store()
    run_dir = Path(argv[-1])
    if (run_dir / "after.json").exists():  # --after: wait first (launcher/waiting.py)
        from trebuchet.backends import refresh
        from trebuchet.launcher import waiting

        if not waiting.wait(store, run_dir.name, run_dir, refresh):
            return 0  # a dependency cannot end as asked (recorded), or cancelled
    run = SshRun(run_dir, store)
    run.install_signals()
    try:
        state = run.run()
    except BaseException:
        import traceback

        traceback.print_exc()
        lifecycle.ended(store, run.rid, "LOST", "the ssh supervisor failed", "lost")
        return 1
    return 0 if state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
