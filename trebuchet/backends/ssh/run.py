"""The ssh engine's supervisor: one run's sessions to its hosts, driven by the one job
controller (runtime/job/life.py) as its Nodes and Records. Connections opened in parallel
and shared, the run's files copied where the run directory is not shared, an ssh session per
host and attempt (its stdin the agent's lifeline), logs split back per rank while they
run, records fetched when a node ends, a dropped connection named as such.

`python -m trebuchet.backends.ssh.run RUN_DIR` is a detached run's supervisor.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from trebuchet.runtime.contracts.schema import FirstFailure, JobFile, Outcome
from trebuchet.runtime.job import nodeloss, nodeset
from trebuchet.runtime.job.life import Ending, JobController, settings
from trebuchet.runtime.job.link import NODE_TIMEOUT_S
from trebuchet.runtime.node import barrier, health
from trebuchet.runtime.rundir.records import attempt_logs, cause, first_failure
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.runtime.watch.hung import expected_names
from trebuchet.store import lifecycle

if TYPE_CHECKING:
    from trebuchet.store.db import Store
    from trebuchet.view.live import View
from trebuchet.backends.ssh.script import (
    LOGIN_S,
    PERSIST_S,
    SESSION,
    SETUP_DONE,
    SETUP_FAILED,
    SETUP_OUTPUT,
    SETUP_TAIL,
    SshFacts,
    attempt_hosts,
    connect_timeout,
    master_address,
    node_script,
    place,
    remote_command,
)

LOST = "connection lost"
BEAT_LINE = nodeloss.BEAT.encode()
ENDED_LINE = nodeloss.ENDED.encode() + b" "
HEALTHY_LINE = barrier.HEALTHY.encode()
STALL_S = 3.0  # a gap between two polls this long: this process was stopped, not the nodes
_LABEL = re.compile(rb"\[(\d+)(?::(\d+))?\] ")


def merge_hang(adir: Path, expected: list[str]) -> bool:
    """Whether a node's hang watch stopped the attempt (runtime/node/per_node.py: each node watches
    its own ranks and dumps their stacks). Its hang.json then covers every rank whose stacks
    came back, from any node, so the diagnosis sees the whole run, not one node's ranks."""
    from trebuchet.store.files import read_json, write_json

    info = read_json(adir / "hang.json")
    if not isinstance(info, dict) or info.get("action") == "warn":
        return False
    stacks = sorted(p.stem for p in (adir / "stacks").glob("*.txt"))
    write_json(adir / "hang.json", {**info, "expected": expected, "stacks": stacks})
    return True


class Node:
    """One host's session of one attempt (the node agent's, or a pre/post command's): the
    ssh process, what its script said before the agent took over, its output."""

    def __init__(self, index: int, host: str, proc: subprocess.Popen, log: IO[bytes],
                 hook: bool = False) -> None:  # fmt: skip
        self.index, self.host, self.proc, self.log, self.hook = index, host, proc, log, hook
        self.returncode: int | None = None
        self.closed = False
        self.reader: threading.Thread | None = None
        self.pgid: int | None = None  # the session's process group on its host
        self.setup_done = False  # the agent (or the pre/post command) took the session over
        self.setup_failed: tuple[int, int] | None = None  # (ssh.setup item from 1, exit code)
        self.setup_output: list[str] = []  # the last lines setup printed, when it failed
        self.signalled: set[str] = set()  # the remote stops sent (TERM, KILL)
        self.heard = time.monotonic()  # the agent's last line (its heartbeat: nodeloss.BEAT)
        self.heard_wall = time.time()
        self.ended: int | None = None  # the agent's last word (nodeloss.ENDED), its code
        self.lost_cause: FirstFailure | None = None  # this node was lost (nodeloss.record)
        self.healthy = False  # its agent's checks passed; it waits for the go (barrier.py)

    def send(self, line: bytes) -> None:
        """A line to the agent on its session's stdin (gone: its exit code says so)."""
        if not self.closed and self.proc.stdin:
            with contextlib.suppress(OSError):
                self.proc.stdin.write(line)
                self.proc.stdin.flush()

    def close_session(self, interrupt: bool = False) -> None:
        """Close stdin: the remote agent stops its ranks (grace, then SIGKILL) and ends.
        `interrupt` (Ctrl+C): INTERRUPT first, so that it stops them as torchrun does
        (SIGINT, then SIGTERM after the grace, SIGKILL after another; runtime/node/per_node.py)."""
        if not self.closed and self.proc.stdin:
            self.closed = True
            with contextlib.suppress(OSError):
                if interrupt and self.setup_done and not self.hook:
                    self.proc.stdin.write(nodeloss.INTERRUPT)
                    self.proc.stdin.flush()
                self.proc.stdin.close()

    @property
    def lost(self) -> bool:
        """The session ended without its agent's end: the connection dropped (ssh exit 255,
        the client killed), or the agent died after setup without its last word."""
        if self.setup_failed is not None or self.returncode is None or self.ended is not None:
            return False
        gone = self.returncode == 255 or self.returncode < 0
        return gone or (self.setup_done and not self.hook)

    def hear(self, line: bytes) -> bool:
        """A line from the agent: it is alive; True for its own heartbeat and end (taken
        in), False for what goes on to the logs."""
        self.heard, self.heard_wall = time.monotonic(), time.time()
        if line.startswith(BEAT_LINE):
            return line.rstrip(b"\r\n") == BEAT_LINE
        if line.rstrip(b"\r\n") == HEALTHY_LINE:
            self.healthy = True
            return True
        if line.startswith(ENDED_LINE):
            code = line[len(ENDED_LINE) :].strip()
            if code.lstrip(b"-").isdigit():
                self.ended = int(code)
                return True
        return False

    def marker(self, line: bytes) -> bool:
        """A line of the session's script (before the agent): taken in; False otherwise."""
        word, _, rest = line.decode(errors="replace").rstrip("\r\n").partition(" ")
        if word == SESSION and rest.isdigit():
            self.pgid = int(rest)
        elif word == SETUP_DONE:
            self.setup_done = True
            self.heard, self.heard_wall = time.monotonic(), time.time()
        elif word == SETUP_FAILED:
            item, _, code = rest.partition(" ")
            self.setup_failed = (int(item), int(code)) if (item + code).isdigit() else (0, 1)
        elif word == SETUP_OUTPUT:
            self.setup_output = [*self.setup_output[-SETUP_TAIL + 1 :], rest]
        else:
            return False
        return True


class SshRun:
    """The supervisor of one ssh run (attached or detached)."""

    def __init__(self, run_dir: Path, store: Store, view: View | None = None) -> None:
        from trebuchet.launcher.index_records import IndexRecords
        from trebuchet.store.files import read_json

        self.run_dir = run_dir
        self.jobfile = cast(JobFile, read_json(run_dir / "job.json"))  # contracts.JobFile
        self.info = cast(SshFacts, read_json(run_dir / "ssh.json"))  # this engine's facts
        self.store = store
        self.view = view
        self.rid = self.info["run_id"]
        self.control = ""
        self.notes: list[str] = []  # said by the main loop (reader threads append)
        self.nodes: list[Node] = []  # this attempt's sessions, one per host
        self.first: Node | None = None  # the first node to end badly: the root cause's
        self.kill_at: float | None = None  # sessions that did not end by then are cut
        self.cancel_said = False
        self.stopping = False  # the attempt is being stopped: nodes that end now are no cause
        self.clock_start = time.monotonic()  # the attempt's start, as the controller's clock
        self.idle = False  # nothing started (the time ran out in `pre`): alive until stopped
        self.remote_stops: list[subprocess.Popen] = []
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

    # -- ssh -----------------------------------------------------------------------------
    def opts(self, master: bool = False) -> list[str]:
        """ssh and its options, through this run's shared connections."""
        mode = ["-M", "-N", "-f"] if master else ["-o", "ControlMaster=auto"]
        return [
            *self.info["ssh"],
            *mode,
            "-o",
            f"ControlPath={self.control}/%C",
            "-o",
            f"ControlPersist={PERSIST_S}",
        ]

    def ssh(self, host: str, *words: str) -> list[str]:
        return [*self.opts(), "--", host, *words]

    def each(self, argvs: list[list[str]], inputs: list[bytes] | None = None) -> list[tuple]:
        """Run one command per host at once; (returncode, stdout, stderr) each. A cancel
        kills them (their results say so: the caller looks at the cancel)."""
        procs = [
            subprocess.Popen(
                a,
                stdin=subprocess.PIPE if inputs else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for a in argvs
        ]
        out: list[tuple] = [(-1, b"", "")] * len(procs)

        def talk(i: int, p: subprocess.Popen) -> None:
            so, se = p.communicate(inputs[i] if inputs else None)
            out[i] = (p.returncode, so, se.decode(errors="replace").strip())

        talkers = [threading.Thread(target=talk, args=(i, p), daemon=True)
                   for i, p in enumerate(procs)]  # fmt: skip
        for t in talkers:
            t.start()
        while any(t.is_alive() for t in talkers):
            if self.cancelled:
                for p in procs:
                    with contextlib.suppress(OSError):
                        p.kill()
            self.nap(0.2)
            for t in talkers:
                t.join(0.0)
        return out

    def connect(self) -> str | None:
        """One master connection per host, all at once, each within ConnectTimeout and
        LOGIN_S for the login (a host that answers and then stalls is cut); why not, or
        None (also when cancelled: the caller looks)."""
        hosts = self.info["hosts"]
        limit = connect_timeout(self.info["ssh"]) + LOGIN_S
        logs = [open(self.run_dir / f"ssh-connect-{i}.log", "wb") for i in range(len(hosts))]  # noqa: SIM115
        stalled: set[int] = set()
        try:
            procs = [
                subprocess.Popen(
                    [*self.opts(master=True), "--", h],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
                for h, log in zip(hosts, logs, strict=True)
            ]
            deadline = time.monotonic() + limit
            while any(p.poll() is None for p in procs):
                if self.cancelled or time.monotonic() >= deadline:
                    break
                self.nap(min(0.2, deadline - time.monotonic()))
            for i, p in enumerate(procs):
                if p.poll() is None:
                    stalled.add(i)
                    p.kill()
                    p.wait()
        finally:
            for log in logs:
                log.close()
        if self.cancelled:
            return None
        for i, (h, p) in enumerate(zip(hosts, procs, strict=True)):
            try:  # a regular file only: the run directory is reachable by earlier ranks
                text = read_text(self.run_dir / f"ssh-connect-{i}.log").strip()
            except OSError:
                text = ""
            if i in stalled:
                return (f"cannot connect to {h}: no ssh login within {limit:g}s (ConnectTimeout "
                        f"{limit - LOGIN_S:g}s and {LOGIN_S}s to log in): the host answered "
                        "but did not complete the ssh handshake"
                        + (f"; ssh said: {text}" if text else ""))  # fmt: skip
            if p.returncode != 0:
                return f"cannot connect to {h} (ssh exit {p.returncode}): {text or 'no message'}"
        self.info["master_addr"] = master_address(self.info)
        return None

    def shared(self) -> bool:
        """Is the run directory the same folder on every host? (ssh.shared_dir, or a token
        written here and read there)"""
        setting = self.info["shared"]
        if setting is not None:
            return setting != "none"
        token = os.urandom(8).hex()
        probe = self.run_dir / ".ssh-probe"
        probe.write_text(token)
        q = shlex.quote(str(probe))
        outs = self.each([self.ssh(h, f"cat {q} 2>/dev/null || true") for h in self.info["hosts"]])
        probe.unlink()
        return all(rc == 0 and so.decode().strip() == token for rc, so, _ in outs)

    def copy(self) -> str | None:
        """The code, the runtime and job.json to every host's per-run folder; why not."""
        info, q = self.info, shlex.quote
        remote, code = info["remote_run_dir"], Path(info["workdir"])
        files = [info["runtime"], "job.json"]
        t0 = time.time()
        results = None
        if shutil.which("rsync") and code == self.run_dir / "code":
            rsh = " ".join(q(a) for a in self.opts())
            mk = f"mkdir -p {q(remote)} && rsync"
            srcs = [f"{self.run_dir}/./{f}" for f in ("code", *files)]
            argv = ["rsync", "-a", "--relative", "-e", rsh, "--rsync-path", mk, *srcs]
            results = self.each([[*argv, f"{h}:{remote}/"] for h in info["hosts"]])
            how = "rsync"
        if self.cancelled:
            return None
        if results is not None and any(r[0] != 0 for r in results):
            err = next(r[2] for r in results if r[0] != 0).splitlines()
            self.say(f"rsync failed ({err[-1] if err else 'no message'}): copying with tar")
        if results is None or any(r[0] != 0 for r in results):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(code, arcname="code")
                for f in files:
                    tar.add(self.run_dir / f, arcname=f)
            data = buf.getvalue()
            cmd = f"mkdir -p {q(remote)} && tar -C {q(remote)} -xf -"
            results = self.each(
                [self.ssh(h, cmd) for h in info["hosts"]], [data] * len(info["hosts"])
            )
            how = "tar"
        if self.cancelled:
            return None
        for h, (rc, _, err) in zip(info["hosts"], results, strict=True):
            if rc != 0:
                return f"copying the run's files to {h}:{remote} failed (exit {rc}): {err}"
        self.say(f"code copied to {len(info['hosts'])} host(s) by {how} in {time.time() - t0:.2f}s")
        return None

    def disconnect(self) -> None:
        if not self.control:
            return
        for p in self.remote_stops:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
            if p.poll() is None:
                p.kill()
                p.wait()
        self.remote_stops = []
        argvs = [[*self.opts(), "-O", "exit", "--", h] for h in self.info["hosts"]]
        for a in argvs:  # not each(): it would stop at a cancel, which is over by now
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(a, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        shutil.rmtree(self.control, ignore_errors=True)

    # -- the run -------------------------------------------------------------------------
    def run(self) -> str:
        from trebuchet.store.lifecycle import run_started

        run_started(self.store, self.rid)
        self.control = tempfile.mkdtemp(prefix="treb-ssh-")
        try:
            return self.job.run()
        finally:
            self.disconnect()

    # -- Nodes (runtime/job/life.py): this engine's side of each attempt -----------------
    def prepare(self) -> FirstFailure | None:
        """Connections to every host, then the run's files where they are not shared. A
        cancel meanwhile stops there: the first attempt then starts nothing and ends
        CANCELLED."""
        from trebuchet.store.files import write_json

        t0 = time.time()
        why = self.connect()
        if why is None and not self.cancelled:
            shared = self.shared()
            if not self.cancelled:
                place(self.info, shared)
                write_json(self.run_dir / "ssh.json", self.info)  # where the files are
                why = None if shared else self.copy()
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
        """After a lost node: the held hosts not excluded (a spare in, or fewer down to
        min_nodes: runtime/job/nodeset.py), NODE_RANK by their order, the master node 0's."""
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
        """The held hosts not excluded (runtime/job/nodeset.py), and why none can go on."""
        hosts = self.info["hosts"]
        want = int(self.info.get("nodes") or len(hosts))
        return nodeloss.next_nodes(str(self.run_dir), hosts, want, self.jobfile.get("min_nodes"))

    def deadline(self) -> float | None:
        """When this attempt's `timeout` ends it (monotonic), or None."""
        timeout = self.jobfile.get("timeout")
        return self.clock_start + float(timeout) if timeout else None

    def pre_post(self, when: str, attempt: int) -> bool:
        """The spec's pre/post command on every host at once, each node's to its end (as
        locally), placed as the node agent is; its output in attempt-<n>/<when>-node-<i>.log.
        False when one failed. A cancel ends them (on the hosts too); so does the attempt's
        timeout during `pre`, which then starts nothing and ends TIMEOUT (the controller's
        clock)."""
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
                self.say(f"node {n.index} ({n.host}): before `{when}`: {self.setup_text(n)}")
        if why == "timeout":
            self.say(f"the attempt's timeout came during `{when}`: its ranks do not start")
            self.idle = True
            return True
        if not ok and why is None:
            self.say(f"{when} command failed on a node; see attempt-{attempt}/{when}-node-*.log")
        return ok or why is not None

    def wait_sessions(self, sessions: list[Node], deadline: float | None) -> str | None:
        """Until every session ended; why they were stopped: "cancel", "timeout" or None."""
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
        """A node that ends badly first names the root cause's node; the controller then
        stops the others. Nothing started (the time ran out in `pre`): running until the
        controller stops the attempt."""
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
                        self.say(f"node {n.index} ({n.host}): {self.setup_text(n)}")
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
        """Every node's checks passed (each agent said so, barrier.py): the go to all of
        them at once, so that no rank starts while another node still checks. Called by the
        reader that hears the last one, and by poll."""
        with self.gate:
            if self.go_sent or self.stopping or self.first is not None or not self.nodes:
                return
            if not all(n.healthy and n.returncode is None for n in self.nodes):
                return
            self.go_sent = True
            for n in self.nodes:
                n.send(f"{barrier.GO}\n".encode())

    def watch_beats(self) -> None:
        """A node whose agent said nothing (not even its heartbeat, every nodeloss.BEAT_S)
        for node_timeout is lost: a dead host, its link down, answers nothing, and ssh's
        own keepalive would take far longer to say so."""
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
        """Node `n` is lost: on record (attempt-N/lost-<node>.json, the event), excluded
        from this run, its session cut here (its host answers nothing), the others
        stopped."""
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
        """Close every session: each agent stops its ranks (grace, SIGKILL) and ends; a
        session still in setup is ended on its host (SIGTERM to its process group); one
        still open after the grace period and 15 s is cut."""
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
        """`sig` to the process group of each session no agent took over yet (setup, a
        pre/post command), on its host, over the shared connection; once per session and
        signal (a session that has not said its group yet gets it when it does: tick)."""
        for n in sessions:
            if n.returncode is not None or n.pgid is None or sig in n.signalled:
                continue
            if n.setup_done and not n.hook:
                continue  # the agent: its closed stdin stops it, with the grace period
            n.signalled.add(sig)
            cmd = remote_command(f"kill -{sig} -- -{n.pgid} 2>/dev/null; true")
            self.remote_stops.append(subprocess.Popen(
                self.ssh(n.host, cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))  # fmt: skip

    def cut(self, sessions: list[Node]) -> None:
        """The sessions did not end: SIGKILL on the hosts (what no agent runs yet), and the
        ssh clients here are killed (an agent then sees its stdin end)."""
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
        self.remote_stops = [p for p in self.remote_stops if p.poll() is None]
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
                self.fetch(n, adir)
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
        state, found = self.outcome(self.nodes, self.first, reason, adir, attempt, hung)
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
        """The attempt's logs as fetched from the hosts, the failing rank's first."""
        return attempt_logs(str(self.run_dir / f"attempt-{attempt}"), (cause or {}).get("log"))

    def exit_code(self) -> int:
        return 0

    def requeue(self) -> None:
        raise AssertionError("ssh hosts have no time limit of their own")

    def open_session(self, i: int, host: str, script: str, log: IO[bytes], adir: Path,
                     stdin_line: bytes | None) -> Node:  # fmt: skip
        """`bash -c script` on `host`, its stderr into `log`; `stdin_line` (the agent's
        secrets) first on its stdin, which stays open as the agent's lifeline. None: a
        pre/post command, all of whose output goes to `log`."""
        proc = subprocess.Popen(
            self.ssh(host, remote_command(script)),
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

    def setup_text(self, n: Node) -> str:
        """'ssh.setup failed at job.yaml:9 (`source /x/activate`), exit code 1'."""
        assert n.setup_failed is not None
        item, code = n.setup_failed
        setup, where = self.info["setup"], self.info.get("setup_where") or []
        if not 1 <= item <= len(setup):
            return f"ssh.setup could not start (exit code {code})"
        text = setup[item - 1].strip().splitlines() or [""]
        shown = text[0] + (" ..." if len(text) > 1 else "")
        at = where[item - 1] if item <= len(where) else f"item {item}"
        if code == 0:  # `exit 0`: no rank would have run
            return f"ssh.setup ended the shell at {at} (`{shown}`) before the node agent started"
        return f"ssh.setup failed at {at} (`{shown}`), exit code {code}"

    def read(self, node: Node, adir: Path) -> None:
        """The session's stdout. Until setup is done: the script's own lines (Node.marker).
        Then a pre/post command's output goes to its log; the agent's `[n:l] line` to rank
        n*ppn+l's log (unless the ranks write the shared run directory themselves), `[n]
        line` to node-n.log, the rest (the agent's own `treb: ...` lines) to
        ssh-<node>.log and the terminal."""
        copy = self.info["remote_root"] is not None
        ppn = int(self.jobfile["ppn"])
        files: dict[str, IO[bytes]] = {}
        assert node.proc.stdout is not None
        try:
            for line in node.proc.stdout:
                if not node.setup_done and node.marker(line):
                    if node.setup_failed is not None and line.startswith(SETUP_FAILED.encode()):
                        node.log.write(f"treb: {self.setup_text(node)}\n".encode())
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

    def fetch(self, node: Node, adir: Path) -> None:
        """The node's attempt folder (records, exact logs, stacks, metrics, the ranks' goodput
        marks) from its host, into `adir`."""
        remote = f"{self.info['remote_run_dir']}/{adir.name}"
        cmd = f"tar -C {shlex.quote(remote)} -cf - ."
        try:
            out = subprocess.run(self.ssh(node.host, cmd), capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            out = None
        if out is None or out.returncode != 0:
            self.notes.append(f"{node.host}: the attempt's records could not be fetched")
            return
        from trebuchet.store.files import write_atomic_bytes

        with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if not member.isfile() or not re.fullmatch(
                    r"((stacks|metrics|marks)/)?[\w.-]+", name
                ):  # the folder's files, stacks, metrics, marks (no paths from the host)
                    continue
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                path = adir / name
                path.parent.mkdir(mode=0o700, exist_ok=True)
                if name.endswith(".log"):  # in place: a `treb logs -f` reader keeps its file
                    with open(path, "ab") as fh:
                        fh.truncate(0)
                        fh.write(data)
                else:
                    write_atomic_bytes(path, data)

    def outcome(
        self,
        nodes: list[Node],
        first: Node | None,
        reason: str | None,
        adir: Path,
        attempt: int,
        hung: bool = False,
    ) -> tuple[str, FirstFailure | None]:
        """The attempt's state and root cause from the records the agents wrote."""
        from trebuchet.store.files import read_json

        records: list[Outcome] = []
        for path in sorted(adir.glob("*.json")):
            rec = read_json(path)
            if isinstance(rec, dict) and "label" in rec:
                node = int(rec.get("node") or 0)
                rec.setdefault("host", self.active[node] if node < len(self.active) else "?")
                records.append(cast("Outcome", rec))
        self.store.set_procs(self.rid, attempt, records)
        if reason == "cancel":
            return "CANCELLED", None
        if reason == "timeout":  # the controller's clock (setup, `pre`, a late agent)
            return "TIMEOUT", None
        if (
            reason == "idle_gpu"
        ):  # the controller's idle-GPU rule stopped them (runtime/watch/gpu.py)
            return "FAILED", None
        if first is None:
            return ("FAILED" if reason == "post" else "SUCCEEDED"), None
        if first.setup_failed is not None:
            return "FAILED", self.setup_cause(first, adir, attempt)
        if first.lost_cause is not None:
            return "FAILED", {**first.lost_cause, "log": str(adir / f"ssh-{first.index}.log")}
        if first.lost:
            what = f"the ssh connection to {first.host} was lost (ssh exit {first.returncode})"
            log = str(adir / f"ssh-{first.index}.log")
            return "FAILED", cause(f"node {first.index}", 255, attempt, first.index,
                                   host=first.host, log=log, message=what)  # fmt: skip
        mine = [r for r in records if (r.get("node") or 0) == first.index]
        if self.jobfile["launcher"] == "horovod":  # node 0's horovodrun ran every host's ranks
            mine = records
        found = first_failure(mine) or first_failure(records)
        if first.returncode == 124 and found is None:
            return "TIMEOUT", None
        if found is None and hung:  # no rank failed: the hang watch stopped them
            return "FAILED", None
        if found is None:
            found = cause(f"node {first.index}", first.returncode or 1, attempt, first.index,
                          host=first.host)  # fmt: skip
        name = f"rank-{found['rank']}" if found.get("rank") is not None else f"node-{first.index}"
        return "FAILED", {**found, "attempt": attempt, "log": str(adir / f"{name}.log")}

    def setup_cause(self, n: Node, adir: Path, attempt: int) -> FirstFailure:
        """A node whose ssh.setup failed: the item, its exit code and its last output line,
        with setup's log (fetched from the host; else the lines its session sent)."""
        assert n.setup_failed is not None
        log = adir / f"setup-node-{n.index}.log"
        if not log.is_file() and n.setup_output:
            log.write_text("".join(f"{line}\n" for line in n.setup_output))
        last = next((ln.strip() for ln in reversed(n.setup_output) if ln.strip()), "")
        what = f"{self.setup_text(n)} on {n.host} (node {n.index})" + (f": {last}" if last else "")
        code = n.setup_failed[1] or n.returncode or 1
        return cause("setup", code, attempt, n.index, host=n.host,
                     log=str(log if log.is_file() else adir / f"ssh-{n.index}.log"),
                     message=what)  # fmt: skip


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
