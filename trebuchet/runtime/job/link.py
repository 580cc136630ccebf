"""The node agents' line to the job controller, one TCP connection per agent of an
attempt's step to the controller's host. Over it an agent says that it started (`hello`,
with its host), that it is alive (`beat`, every BEAT_S from a thread of its own), that its
node's health checks passed (`health`: it then waits for the controller's `go`, sent
once every task of the step said so: barrier.py), and once its records are written, that
it ended and with which code (`ended`), and, where the controller keeps its step for the
next attempt (`park`), that it waits for the controller's word: `next <attempt>` (run that
attempt's ranks, in the same srun step) or `exit`. An agent whose rank failed says so
(`failed`) and the controller tells every other agent of the attempt to stop its ranks
(`stop <attempt>`: SIGTERM, the grace period, SIGKILL, by the agent), instead of a
`scancel --signal=TERM` through slurmctld; so do the controller's own teardowns (a hang,
the timeout, a cancel, a lost node: `stop_all`). An agent it cannot reach, or one that has
not ended within the grace period, gets that scancel after all (Controller.watch_nodes).
With it the controller:

- goes on as soon as every agent has ended, instead of waiting for the engine to report
  the step's end (srun does so 0.1-0.15 s after its last task exited: most of a retry's
  time inside an allocation);
- starts a retry in the same allocation on its word to the parked agents, without a new
  srun step (creating one, and an interpreter per node, is most of a retry's seconds);
- notices a lost node within seconds: an agent that said hello and then stays silent for
  the spec's `node_timeout` without saying it ended (Slurm itself would notice only after
  SlurmdTimeout, 300 s by default, and srun would wait for that node's tasks until then).

A connection carries a random token that only the step's environment holds, so no other
process can end an attempt or keep a node alive. An agent that cannot reach the
controller goes on without the line: the controller then waits for the step as before.

Stdlib only, Python >= 3.8 (it ships in the runtime file).
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import threading
import time

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Callable, NamedTuple
else:
    from ..contracts.named import NamedTuple

ENV = "TREB_CONTROLLER_LINK"  # host:port:token, in the step's environment
PARK_ENV = "TREB_AGENT_PARK"  # "1": the controller may run the next attempt on the parked agents
CONNECT_S = 1.0  # an agent gives up on the link (and goes on without it) after this
BEAT_S = 2.0  # an agent's heartbeat; node_timeout is several of them
NODE_TIMEOUT_S = 10.0  # the spec's node_timeout when it says none
LINE_MAX = 256
BACKLOG = 4096
ACK = b"ok\n"  # the controller's answer to each line that carries the token
GO = b"go\n"  # every task's node is healthy: start the ranks (barrier.py)
NEXT = "next"  # `next <attempt>`: a parked agent runs that attempt
EXIT = b"exit\n"  # a parked agent exits (a new step follows, or the job ended)
STOP = "stop"  # `stop <attempt>`: another agent's rank failed, stop this node's ranks


class Lost(NamedTuple):
    """A node whose agents fell silent: its host and when it was last heard (wall clock)."""

    host: str
    last_seen: float
    silent: float  # seconds


class Placement(NamedTuple):
    """A parked agent's node in the next attempt, when the nodes changed (a lost node's
    spare): its node rank, the attempt's node count, the master's address and port, and
    the node lists its ranks' Slurm variables say (the attempt's nodes in node-rank order,
    the job's as Slurm has them now; "" from a controller that did not say them)."""

    node: int
    nodes: int
    master: str
    port: str
    step_nodes: str = ""
    job_nodes: str = ""


class _Task:
    def __init__(self, host: str) -> None:
        self.host = host
        self.heard = time.monotonic()
        self.heard_wall = time.time()
        self.code: int | None = None  # said when it ended
        self.conn: socket.socket | None = None  # where its `health` came: the go goes there
        self.sock: socket.socket | None = None  # its connection (its `park`, the next word)


class Hub:
    """The controller's end: a listening socket and a thread that reads the agents' lines.
    `expect(attempt, tasks)` before each step; then `ended()` and `lost()`."""

    def __init__(self, wake_fd: int) -> None:
        import secrets  # here: the agents, which only report, never pay its import

        self.wake_fd = wake_fd  # written when the attempt's last agent ended
        self.token = secrets.token_hex(16)
        _more_files()
        # A backlog for every agent of a large job connecting at once (the kernel caps it at
        # net.core.somaxconn): with listen()'s default of 128, agents past it waited out
        # SYN retries and went on without the link (bench/fleet_sim.py: 4 of 1,024).
        self.server = socket.create_server(("", 0), family=socket.AF_INET, backlog=BACKLOG)
        self.server.setblocking(False)
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.attempt = -1
        self.count = 0  # the step's tasks
        self.tasks: dict[str, _Task] = {}  # this attempt's, by task id
        self.ended_count = 0  # of this attempt's tasks (counted: no scan per `ended` line)
        self.healthy_count = 0  # of this attempt's tasks that said their node is healthy
        self.go_given = False  # this attempt's go went out: a later `health` gets it at once
        # this attempt's agents that ended and wait for the next word: task id -> (host, conn)
        self.parked: dict[str, tuple[str, socket.socket]] = {}
        self.stop_at: float | None = None  # when this attempt's stop went out (`failed`)
        self.unreached = False  # ... and an agent it could not reach: scancel at once
        self.fell_back = False  # the scancel was asked for (stop_overdue)
        self.stopped_by: str | None = None  # the failed agent's host, until take_stop
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.server, selectors.EVENT_READ, None)
        self.buffers: dict[socket.socket, bytes] = {}
        self.closed = False
        threading.Thread(target=self._serve, name="agent-link", daemon=True).start()

    def address(self, host: str) -> str:
        return f"{host}:{self.port}:{self.token}"

    def expect(self, attempt: int, tasks: int) -> None:
        """A new step's attempt: its `tasks` agents will say hello."""
        with self.lock:
            self.attempt, self.count, self.tasks, self.ended_count = attempt, tasks, {}, 0
            self.healthy_count, self.go_given = 0, False
            self.parked = {}
            self.stop_at, self.unreached, self.fell_back = None, False, False

    def parked_count(self) -> int:
        with self.lock:
            return len(self.parked)

    def resume(self, attempt: int, tasks: int) -> bool:
        """The next attempt on the parked agents, when every one of the step's `tasks`
        parked: each is told `next <attempt>` and counts as heard now (one that never
        speaks again is lost after node_timeout, as any). False: a new step is needed."""
        with self.lock:
            if tasks <= 0 or len(self.parked) != tasks:
                return False
            parked, self.parked = self.parked, {}
            self.attempt, self.count, self.ended_count, self.healthy_count = attempt, tasks, 0, 0
            self.tasks, self.go_given = {}, False
            self.stop_at, self.unreached, self.fell_back = None, False, False
            word = f"{NEXT} {attempt}\n".encode()
            for task_id, (host, conn) in parked.items():
                task = self.tasks[task_id] = _Task(host)
                task.sock = conn
                # its end went away meanwhile: the others may already run the attempt, so
                # it is this attempt's silent node (lost after node_timeout), not a new step
                with contextlib.suppress(OSError):
                    conn.send(word)
            return True

    def resume_on(self, attempt: int, use: list[str], master: str, port: str,
                  job_nodes: str = "") -> list[str] | None:  # fmt: skip
        """The next attempt on the parked agents of the nodes it keeps after a lost node,
        each told its new place (`next <attempt> <node rank> <nodes> <master> <port>
        <attempt's nodes> <job's nodes>`: its ranks get the new rank contract and Slurm
        variables), and on a new step's agents on the others (the
        spares; their hello joins them to the attempt). The nodes that need that new step;
        None (a whole new step) unless every parked agent is one node's and on a node of
        `use` (in node-rank order, one agent per node), and at least one parked."""
        with self.lock:
            hosts = [host for host, _conn in self.parked.values()]
            if (not hosts or len(set(hosts)) != len(hosts) or len(set(use)) != len(use)
                    or not set(hosts) <= set(use)):  # fmt: skip
                return None
            parked, self.parked = self.parked, {}
            self.attempt, self.count, self.ended_count, self.healthy_count = attempt, len(use), 0, 0
            self.tasks, self.go_given = {}, False
            self.stop_at, self.unreached, self.fell_back = None, False, False
            for task_id, (host, conn) in parked.items():
                task = self.tasks[task_id] = _Task(host)
                task.sock = conn
                word = (f"{NEXT} {attempt} {use.index(host)} {len(use)} {master} {port} "
                        f"{','.join(use)} {job_nodes or ','.join(use)}\n")  # fmt: skip
                with contextlib.suppress(OSError):  # gone meanwhile: lost after node_timeout
                    conn.send(word.encode("ascii", "replace"))
            return [host for host in use if host not in hosts]

    def release(self) -> None:
        """`exit` to every parked agent: no attempt follows in their step."""
        with self.lock:
            parked, self.parked = self.parked, {}
        for _host, conn in parked.values():
            with contextlib.suppress(OSError):
                conn.send(EXIT)

    def ended(self) -> int | None:
        """The step's exit code as srun would give it (the highest of its tasks') once every
        agent of the current attempt said it ended; None before."""
        with self.lock:
            if self.count <= 0 or self.ended_count < self.count:
                return None  # polled by the controller's loop: no scan until all ended
            return max(t.code for t in self.tasks.values() if t.code is not None)

    def lost(self, timeout: float) -> list[Lost]:
        """The nodes of this attempt with an agent that said hello, has not ended and has
        been silent for longer than `timeout`; the longest silent first."""
        now = time.monotonic()
        found: dict[str, Lost] = {}
        with self.lock:
            for task in self.tasks.values():
                silent = now - task.heard
                if task.code is None and silent > timeout:
                    seen = found.get(task.host)
                    if seen is None or silent > seen.silent:
                        found[task.host] = Lost(task.host, task.heard_wall, silent)
        return sorted(found.values(), key=lambda lost: -lost.silent)

    def stop_overdue(self, grace: float) -> bool:
        """True once (then the controller scancels the step) when this attempt's stop went
        out over the link and an agent could not be reached, or not every agent ended
        within `grace` seconds of it: no rank is left running for want of an answer."""
        with self.lock:
            if self.stop_at is None or self.fell_back or self.ended_count >= self.count:
                return False
            if not self.unreached and time.monotonic() - self.stop_at <= grace:
                return False
            self.fell_back = True
            return True

    def stop_all(self) -> bool:
        """The controller's own teardown (a hang, the timeout, a cancel, a lost node):
        `stop <attempt>` to every agent of the attempt that has not ended, as on a rank's
        `failed` (once per attempt). False when one cannot be reached (not connected, or
        not yet heard): the caller scancels the step at once, and stop_overdue does not
        ask again; one that does not end within the grace period, stop_overdue."""
        with self.lock:
            if self.stop_at is None:
                self._stop_others(None)
            if self.unreached and not self.fell_back:
                self.fell_back = True
                return False
            return not self.unreached

    def take_stop(self) -> str | None:
        """The host whose agent's `failed` made this attempt's stop, once (for the log)."""
        with self.lock:
            host, self.stopped_by = self.stopped_by, None
            return host

    def settled(self, lost: list[str]) -> bool:
        """Every agent of this attempt ended, but those on the `lost` hosts (one that never
        said hello counts too: a spare's step that ended before its agent spoke)."""
        with self.lock:
            gone = [t for t in self.tasks.values() if t.code is not None or t.host in lost]
            heard = {t.host for t in self.tasks.values()}
            silent = [host for host in dict.fromkeys(lost) if host not in heard]
            return len(gone) + len(silent) >= self.count > 0

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.server.close()

    def _serve(self) -> None:
        while not self.closed:
            try:
                events = self.sel.select(timeout=1.0)
            except (OSError, ValueError):
                return
            for key, _ in events:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.server:
                    self._accept()
                else:
                    self._read(sock)

    def _accept(self) -> None:
        """Every connection waiting (thousands arrive together when a large step starts)."""
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:  # none left (BlockingIOError), or out of descriptors
                return
            conn.setblocking(False)
            self.buffers[conn] = b""
            self.sel.register(conn, selectors.EVENT_READ, None)

    def _read(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        buf = self.buffers.get(conn, b"") + data
        *lines, rest = buf.split(b"\n")
        for line in lines:
            if self._line(line.decode("ascii", "replace").split(), conn):
                with contextlib.suppress(OSError):  # the agent's sign that this end lives
                    conn.send(ACK)
        if not data or len(rest) > LINE_MAX:
            with self.lock:  # a parked agent that went away cannot run the next attempt
                for task_id in [t for t, (_h, c) in self.parked.items() if c is conn]:
                    del self.parked[task_id]
            self.sel.unregister(conn)
            self.buffers.pop(conn, None)
            conn.close()
            return
        self.buffers[conn] = rest

    def _line(self, words: list[str], conn: socket.socket | None = None) -> bool:
        """One line read; True when it carries the token (it is answered, whatever its
        attempt: the agents notice a controller that stopped answering)."""
        # "<what> <token> <attempt> <task> <host|code|->"
        if len(words) != 5 or words[1] != self.token:
            return False
        what, attempt_text, task_id, value = words[0], words[2], words[3], words[4]
        try:
            attempt = int(attempt_text)
        except ValueError:
            return True
        done = False
        with self.lock:
            if attempt != self.attempt:
                return True
            task = self.tasks.get(task_id)
            if what == "hello" and task is None:
                task = self.tasks[task_id] = _Task(value)
            elif task is not None and what in ("hello", "beat", "ended", "health", "park",
                                               "failed"):  # fmt: skip
                task.heard, task.heard_wall = time.monotonic(), time.time()
            if task is not None and conn is not None:
                task.sock = conn
            if what == "park" and task is not None and conn is not None:
                self.parked[task_id] = (task.host, conn)
            if what == "health" and task is not None and value == "ok" and conn is not None:
                self._healthy(task, conn)
            if what == "failed" and task is not None and self.stop_at is None:
                self._stop_others(task_id)
                done = True  # the controller looks at once (stop_overdue)
            if what == "ended":
                try:
                    code = int(value)
                except ValueError:
                    return True
                if task is None:  # no hello came (an older agent): the end counts anyway
                    task = self.tasks[task_id] = _Task("?")
                if task.code is None:
                    task.code = code
                    self.ended_count += 1
                    done = self.ended_count == self.count
        if done:
            with contextlib.suppress(OSError):
                os.write(self.wake_fd, b"\0")
        return True

    def _stop_others(self, failed: str | None) -> None:
        """`stop <attempt>` to every agent of the attempt but the failed one's (None: the
        controller's own stop), under the lock; one not connected, or not yet heard,
        leaves the stop to scancel."""
        self.stop_at = time.monotonic()
        self.stopped_by = self.tasks[failed].host if failed is not None else None
        self.unreached = len(self.tasks) < self.count
        word = f"{STOP} {self.attempt}\n".encode()
        for task_id, task in self.tasks.items():
            if task_id == failed or task.code is not None:
                continue
            try:
                if task.sock is None or task.sock.send(word) != len(word):
                    self.unreached = True
            except OSError:
                self.unreached = True

    def _healthy(self, task: _Task, conn: socket.socket) -> None:
        """A task's node is healthy (under the lock). Once every task of the step said so:
        the go to each (barrier.py), one scan; a task that says it after that, at once."""
        if task.conn is not None:
            return
        task.conn = conn
        self.healthy_count += 1
        if self.go_given:
            with contextlib.suppress(OSError):
                conn.send(GO)
        elif self.healthy_count >= self.count:
            self._go()

    def _go(self) -> None:
        self.go_given = True
        for each in self.tasks.values():
            if each.conn is not None:
                with contextlib.suppress(OSError):
                    each.conn.send(GO)

    def barrier_steps(self) -> set[str] | None:
        """While this attempt's go waits for a task that said no `health` on the link (one
        without a link, or still checking): the Slurm step ids of the tasks that said hello,
        for the controller to read the nodes' health records of (Controller.barrier_files:
        one reader, not every agent). None once the go went out."""
        with self.lock:
            if self.go_given or self.count <= 0 or self.healthy_count >= self.count:
                return None
            return {task_id.split(".", 1)[0] for task_id in self.tasks}

    def go_all(self) -> None:
        """The go to every task that said `health`, decided by the health records (a task
        without a link said it in its record only); later ones get it as they say it."""
        with self.lock:
            if not self.go_given:
                self._go()


def _more_files() -> None:
    """The controller holds a descriptor per agent: its soft limit raised to the hard one
    (a batch step inherits the login shell's, often 1,024, below a job of 1,024 tasks)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def parse(value: str) -> tuple[str, int, str] | None:
    """host:port:token (the host may hold colons: an IPv6 address) or None."""
    parts = value.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[2]:
        return None
    try:
        return parts[0], int(parts[1]), parts[2]
    except ValueError:
        return None


def encode(what: str, token: str, attempt: int, task: str, value: str) -> bytes:
    """One line of the protocol, as Hub._line reads it."""
    return f"{what} {token} {attempt} {task} {value}\n".encode("ascii", "replace")


class Link:
    """The agent's end: hello at the start, a heartbeat thread, `ended` as the last word.
    Every send is best effort: the link never delays or fails the agent."""

    def __init__(self, sock: socket.socket | None, token: str, attempt: int, task: str,
                 on_lost: Callable[[float], None] | None = None,
                 timeout: float = NODE_TIMEOUT_S) -> None:  # fmt: skip
        self.sock, self.token, self.attempt, self.task = sock, token, attempt, task
        self.host = "?"  # as said in its hello (open_link)
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        # the controller's answers: silent for `timeout`, its node is lost (`on_lost`,
        # with when it was last heard); Slurm's batch host (runtime/job/batchloss.py)
        self.on_lost, self.timeout = on_lost, timeout
        self.heard, self.heard_wall = time.monotonic(), time.time()
        self.go = threading.Event()  # the controller's go came (barrier.py)
        self._said = b""  # its answers' last, unfinished line
        self.word = threading.Event()  # parked: the controller's next word came
        self.next: int | None = None  # ... the attempt it said, None: exit
        self.placement: Placement | None = None  # ... and this node's new place in it
        self.parked = False  # ended, waiting for the word (no batch-host loss then)
        # the controller's `stop` for this attempt (another node's rank failed): called
        # from the reading thread; the agent stops its ranks (task.py)
        self.on_stop: Callable[[], None] | None = None
        self.stop_said = False  # ... it came (also before on_stop was set)
        self.stop_next = False  # parked: the next attempt's stop came right behind `next`
        if sock is not None:
            threading.Thread(target=self._beat, name="agent-beat", daemon=True).start()

    def _send(self, what: str, value: str) -> bool:
        line = encode(what, self.token, self.attempt, self.task, value)
        with self.lock:
            if self.sock is None:
                return False
            try:
                self.sock.sendall(line)
                return True
            except OSError:
                with contextlib.suppress(OSError):
                    self.sock.close()
                self.sock = None
                return False

    def _listen(self, until: float) -> None:
        """Until `until` (monotonic): the controller's words as they come (a `stop` must
        reach the ranks at once, not at the next heartbeat)."""
        while not self.stopped.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return
            sock = self.sock
            if sock is None:
                self.stopped.wait(left)
                return
            try:  # bounded: a socket closed by ended() does not wake a select
                ready = select.select([sock], [], [], min(left, 0.5))[0]
            except (OSError, ValueError):
                ready = []
                self.stopped.wait(min(left, 0.5))
            if ready:
                self._answers()

    def _beat(self) -> None:
        while True:
            self._listen(time.monotonic() + BEAT_S)
            if self.stopped.is_set():
                return
            sent = self._send("beat", "-")
            self._answers()
            if self.on_lost is not None and time.monotonic() - self.heard > self.timeout:
                if self.parked:  # no ranks to stop: the parked agent exits
                    self.word.set()
                elif not self.stopped.is_set():
                    self.on_lost(self.heard_wall)
                return
            if not sent and self.on_lost is None:
                return

    def _answers(self, wait: float = 0.0) -> None:
        """The controller's answers so far, waiting up to `wait` for the first."""
        with self.lock:
            while self.sock is not None:
                try:  # (the socket has a timeout for sendall: recv only what is there)
                    if not select.select([self.sock], [], [], wait)[0]:
                        return
                    wait = 0.0
                    data = self.sock.recv(4096)
                except (BlockingIOError, InterruptedError, TimeoutError):
                    return
                except (OSError, ValueError):
                    data = b""
                if not data:  # the controller's end closed: no more answers
                    self.sock.close()
                    self.sock = None
                    self.word.set()  # parked: no word will come, exit
                    return
                self.heard, self.heard_wall = time.monotonic(), time.time()
                *lines, rest = (self._said + data).split(b"\n")
                self._said = rest[-LINE_MAX:]
                for line in lines:
                    self._answer(line)

    def _answer(self, line: bytes) -> None:
        """One line of the controller's (under the lock): ok, go, next N, exit."""
        if line + b"\n" == GO:
            self.go.set()
        elif line + b"\n" == EXIT:
            self.word.set()
        elif line.startswith(NEXT.encode() + b" "):
            self._next(line.split(b" ")[1:])
        elif line == f"{STOP} {self.attempt}".encode() and not self.parked:
            self.stop_said = True
            if self.on_stop is not None:
                self.on_stop()
        elif self.parked and line == f"{STOP} {self.next}".encode():
            self.stop_next = True  # right behind its `next`: next_attempt keeps it

    def _next(self, words: list[bytes]) -> None:
        """`next <attempt>`, or with the attempt's placement of this node (a lost node's
        spare in a new step beside this one): `<node rank> <nodes> <master> <port>`, then
        the attempt's and the job's node lists (a controller before them: without)."""
        if len(words) not in (1, 5, 7) or not all(w.isdigit() for w in words[:3]):
            return
        if len(words) > 1:
            node, nodes, master, port = int(words[1]), int(words[2]), words[3], words[4]
            if node >= nodes or not master or not port.isdigit():
                return
            lists = [w.decode("ascii", "replace") for w in words[5:]] or ["", ""]
            self.placement = Placement(node, nodes, master.decode("ascii", "replace"),
                                       port.decode(), *lists)  # fmt: skip
        self.next = int(words[0])
        self.word.set()

    def failed(self) -> bool:
        """A rank of this node failed: the controller stops the other nodes' ranks (its
        `stop`). False when there is no link to say it on (then scancel does)."""
        return self._send("failed", "-")

    def healthy(self) -> bool:
        """This task's node passed its checks; False when there is no link to say it on."""
        return self._send("health", "ok")

    def wait_go(self, wait: float) -> bool | None:
        """True once the controller said go; None before it (within `wait` seconds)."""
        if not self.go.is_set():
            self._answers(wait)
        return True if self.go.is_set() else None

    def park(self, code: int) -> None:
        """The agent's end of this attempt (`ended`), then that it waits for the next word
        (wait_next) in the same step; the heartbeat goes on."""
        self.parked = True
        self._send("park", "-")  # first: once the controller counts every end, all parked
        self._send("ended", str(code))

    def wait_next(self, stopped: Callable[[], bool]) -> int | None:
        """The attempt the controller says to run next; None: exit (its word, its end
        closed or silent for the timeout, or `stopped()`)."""
        while not self.word.is_set() and not stopped():
            self._answers(0.05)
            if self.sock is None:
                break
        return self.next if self.word.is_set() else None

    def next_attempt(self, attempt: int) -> None:
        """The next attempt begins on this link: its hello, a new go to wait for."""
        with self.lock:  # not while _answer reads a stop for this attempt
            self.attempt, self.parked, self.next, self.placement = attempt, False, None, None
            self.stop_said, self.stop_next = self.stop_next, False
        self.go.clear()
        self.word.clear()
        self._send("hello", self.host)

    def close(self) -> None:
        """Its end, after `park` (the controller's exit word): nothing more to say."""
        self.stopped.set()
        with self.lock, contextlib.suppress(OSError):
            if self.sock is not None:
                self.sock.close()
                self.sock = None

    def ended(self, code: int) -> None:
        """The agent's last word: its records are written and it exits with `code`."""
        self.stopped.set()
        if not self._send("ended", str(code)):  # a link lost on the way: one more try
            report_ended(self.attempt, self.task, code)
        with self.lock, contextlib.suppress(OSError):
            if self.sock is not None:
                self.sock.close()


def open_link(attempt: int, task: str, host: str,
              on_lost: Callable[[float], None] | None = None,
              timeout: float = NODE_TIMEOUT_S) -> Link | None:  # fmt: skip
    """The agent's link to its controller (None: no controller asked for one); `on_lost`:
    called (from the heartbeat's thread) once the controller stayed silent `timeout`."""
    target = parse(os.environ.get(ENV, ""))
    if target is None:
        return None
    address, port, token = target
    dest = address.encode() if address.isascii() else address  # str: the idna codec, ~3 ms
    try:
        sock: socket.socket | None = socket.create_connection(
            (dest, port),  # type: ignore[arg-type]  # as bytes too (getaddrinfo's host)
            CONNECT_S,
        )
    except OSError:
        sock = None
    link = Link(sock, token, attempt, task, on_lost if sock is not None else None, timeout)
    link.host = host.replace(" ", "_") or "?"
    link._send("hello", link.host)
    return link


def report_ended(attempt: int, task: str, code: int) -> None:
    """The end said on a connection of its own (an agent whose link broke). Best effort
    within CONNECT_S; the controller falls back on the step's end without it."""
    target = parse(os.environ.get(ENV, ""))
    if target is None:
        return
    host, port, token = target
    line = encode("ended", token, attempt, task, str(code))
    with contextlib.suppress(OSError), socket.create_connection((host, port), CONNECT_S) as sock:
        sock.sendall(line)
