"""SSH: machines without a scheduler. One node agent per host, started with the system `ssh`.

The run is supervised here, on the submitting machine (attached: `treb run` itself;
detached: a background process, `python -m trebuchet.backends.ssh.engine RUN_DIR`), as locally.
Per run: one connection per host, opened in parallel and shared by every later command
(OpenSSH's ControlMaster, sockets in a private folder, ControlPersist short), so a 16-host
launch costs one round of handshakes, not 16 in a row. The run's files reach the hosts
unless they are already there: the run directory is detected on a shared filesystem (or
`ssh.shared_dir` says so), else the code snapshot, the runtime archive and job.json are
copied to `<ssh.remote_dir>/<run id>/` on each host (rsync where both ends have it, else
tar over the connection). Per attempt: `ssh HOST sh -c SCRIPT` on every host, SCRIPT
placing the node (NODE_RANK by host order, MASTER_ADDR node 0's address as ssh's config
resolves it) and exec'ing the runtime's `node` verb (runtime/node.py: ranks, records, first
failure within the node, timeout). Every value in SCRIPT is shlex-quoted; secrets travel
on the session's stdin, never on a command line. The session's stdin is also the agent's
lifeline: its end (cancel closes it; the connection drops; this process dies) makes the
agent stop its ranks, so nothing outlives the session on any host.

Logs: with a shared run directory the ranks write into it directly. Otherwise the agent's
labelled copy of the logs on its stdout is split back into `attempt-<n>/rank-<r>.log` here
while the run runs (`treb logs -f`), and when a node ends its attempt folder (records and
the exact logs) is fetched over the connection. `attempt-<n>/ssh-<node>.log` keeps what ssh
and the agent said. A host whose agent fails first names the attempt's root cause (its
rank's record, with the host); a dropped connection is named as such.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from trebuchet.backends.base import Backend, Submitted
from trebuchet.backends.job_file import (
    check_node_engine,
    engine_options,
    job_text,
    node_job,
    uses_secret,
)
from trebuchet.errors import UserError
from trebuchet.runtime.contracts import FirstFailure, Outcome
from trebuchet.runtime.hang import expected_names
from trebuchet.runtime.lifecycle import Ending, JobController, Settings
from trebuchet.runtime.procs import hostname
from trebuchet.runtime.records import attempt_logs, cause, first_failure
from trebuchet.runtime.task import NO_PYTHON
from trebuchet.store import lifecycle

if TYPE_CHECKING:
    from trebuchet.backends.ssh.options import Ssh
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store
    from trebuchet.view.live import View

CONNECT_TIMEOUT_S = 20
PERSIST_S = 15  # a master outlives its last session this long (a killed supervisor's too)
LOST = "connection lost"
_HOST = re.compile(r"[A-Za-z0-9_.@:\[\]%-]+")  # no option (leading -), space or shell syntax
_LABEL = re.compile(rb"\[(\d+)(?::(\d+))?\] ")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None
    where: str  # file:line or the field, for errors


def hosts(loaded: LoadedSpec) -> list[Host]:
    """ssh.hosts, then the hostfile's (DeepSpeed's `host slots=N`; # comments)."""
    sp: Ssh = engine_options(loaded.spec, "ssh")
    out = [Host(h, None, loaded.where("ssh", "hosts")) for h in sp.hosts]
    if sp.hostfile:
        path = loaded.base / os.path.expanduser(sp.hostfile)
        try:
            text = path.read_text()
        except OSError as exc:
            raise UserError(f"{loaded.where('ssh', 'hostfile')}: ssh.hostfile: {exc}") from None
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            slots = None
            for w in words[1:]:
                m = re.fullmatch(r"slots=(\d+)", w)
                if not m:
                    raise UserError(f"{path}:{n}: {w!r}: expected `host` or `host slots=N`")
                slots = int(m.group(1))
            out.append(Host(words[0], slots, f"{path}:{n}"))
    return out


def ssh_argv(sp: Any, control_dir: str | None) -> list[str]:
    """`ssh` with the spec's settings (ssh's own config still applies) and, during a run,
    the shared connection."""
    argv = ["ssh"]
    if sp.config_file:
        argv += ["-F", os.path.expanduser(sp.config_file)]
    if sp.user:
        argv += ["-l", sp.user]
    if sp.port:
        argv += ["-p", str(sp.port)]
    if sp.identity_file:
        argv += ["-i", os.path.expanduser(sp.identity_file)]
    for opt in sp.options:
        argv += ["-o", opt]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
    if control_dir:
        argv += [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={control_dir}/%C",
            "-o",
            f"ControlPersist={PERSIST_S}",
        ]
    return argv


def node_script(info: dict[str, Any], node: int, attempt: int, hook: str | None = None) -> str:
    """What `sh -c` runs on host `node`: every value quoted, the user's setup lines as
    written, then the node agent in place of the shell (`hook`: the spec's pre or post
    command instead, under bash as locally)."""
    q = shlex.quote
    env = {
        **info["env"],
        "NODE_RANK": str(node),
        "NUM_NODES": str(len(info["hosts"])),
        "MASTER_ADDR": info["master_addr"],
        "MASTER_PORT": str(info["master_port"]),
        "TREB_RUN_ID": info["run_id"],
        "TREB_RUN_DIR": info["remote_run_dir"],
        "TREB_ATTEMPT": str(attempt),
        **({} if hook else {"TREB_NODE_STDIN": "1"}),
        # ranks started by bash would source ~/.bashrc again (bash does so when it sees
        # SSH_CLIENT at level 1), undoing ssh.setup's PATH: the login shell did it once
        "SHLVL": "1",
    }
    del env["TREB_RUN_DIR"]  # from the run folder itself: a relative remote_dir is $HOME's
    lines = [
        f"cd {q(info['remote_run_dir'])} || exit 2",
        'TREB_RUN_DIR="$PWD"',
        f"cd {q(info['remote_workdir'])} || exit 2",
        *info["setup"],
        *[f"export {k}={q(v)}" for k, v in env.items()],
        "export TREB_RUN_DIR",
        *([f"exec bash -c {q(hook)}"] if hook else [
            NO_PYTHON,
            f'exec python3 -S "$TREB_RUN_DIR"/{q(info["runtime"])} node "$TREB_RUN_DIR"/job.json',
        ]),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def remote_command(script: str) -> str:
    """The one word ssh hands to the remote login shell (bash, zsh, dash alike)."""
    return "sh -c " + shlex.quote(script)


class SshBackend(Backend):
    name = "ssh"

    def _hosts(self, loaded: LoadedSpec) -> list[Host]:
        spec = loaded.spec
        found = hosts(loaded)
        if not found:
            raise UserError(f"{loaded.where('ssh')}: ssh: give ssh.hosts or ssh.hostfile")
        for h in found:
            if not _HOST.fullmatch(h.name) or h.name.startswith("-"):
                raise UserError(f"{h.where}: {h.name!r} is not a host name")
            if h.slots is not None and h.slots < spec.ranks_per_node:
                raise UserError(
                    f"{h.where}: {h.name} has slots={h.slots}, fewer than procs_per_node "
                    f"({spec.ranks_per_node}): every node runs procs_per_node ranks"
                )
        if len(found) < spec.nodes:
            raise UserError(
                f"{loaded.where('nodes')}: nodes: {spec.nodes}, but ssh names only "
                f"{len(found)} host(s)"
            )
        return found[: spec.nodes]

    def check(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        self._hosts(loaded)
        check_node_engine(spec, loaded.source, "ssh")
        if spec.environment is not None and not spec.environment.bare_nodes_only:
            raise UserError(
                f"{loaded.where('environment')}: environment: the ssh engine does not build "
                "environments on the hosts; prepare them and enter one with ssh.setup lines"
            )
        if not shutil.which("ssh"):
            raise UserError("--on ssh: no ssh client on PATH (Debian: openssh-client)")
        sp: Ssh = engine_options(spec, "ssh")
        shared = sp.shared_dir
        if shared and shared != "none":
            from trebuchet.store.paths import runs_dir

            root = Path(os.path.expanduser(shared)).resolve()
            if not runs_dir().resolve().is_relative_to(root):
                raise UserError(
                    f"{loaded.where('ssh', 'shared_dir')}: ssh.shared_dir: the run "
                    f"directories ({runs_dir()}) are not under {root}: set TREB_HOME there"
                )

    def info(self, loaded: LoadedSpec, run_id: str, run_dir: Path, runtime: str) -> dict:
        """Everything the supervisor needs (ssh.json): hosts, the ssh command, where the
        run's files are on the hosts until the copy step says otherwise."""
        from trebuchet.launcher.policies import policies_for

        spec = loaded.spec
        sp: Ssh = engine_options(spec, "ssh")
        names = [h.name for h in self._hosts(loaded)]
        env = {k: v for k, v in spec.env.items() if not uses_secret(v, spec.secrets)}
        # A port per run (from its id, as Slurm's from the job id): two runs sharing a host
        # rarely collide. The spec's MASTER_PORT wins.
        port = spec.fixed_port or (15000 + int(run_id, 16) % 10000 if _hex(run_id) else 29500)
        return {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "hosts": names,
            "ssh": ssh_argv(sp, None),
            "shared": sp.shared_dir,  # None: detect; "none": copy; a path: shared
            "remote_root": sp.remote_dir,
            "workdir": str(loaded.workdir),
            "runtime": runtime,
            "master_addr": sp.master_addr or "",
            "master_port": port,
            "env": env,
            "setup": list(sp.setup),
            "secrets": sorted(spec.secrets),
            "retries": spec.retries,
            "on_hang": spec.on_hang,
            "log_policies": policies_for(spec),
            "grace_period": float(spec.grace_period),
            "launcher": spec.launcher,
            "ppn": spec.ranks_per_node,
            "pre": spec.pre,
            "post": spec.post,
        }

    def render(self, loaded: LoadedSpec) -> str:
        from trebuchet.launcher.runtime_file import file_name
        from trebuchet.store.paths import runs_dir

        run_dir = runs_dir() / "RUN_ID"
        info = self.info(loaded, "RUN_ID", run_dir, file_name())
        _place(info, shared=info["shared"] not in (None, "none"))
        ssh = " ".join(shlex.quote(a) for a in info["ssh"])
        files = "shared: nothing copied" if info["remote_root"] is None else "copied to each host"
        out = [
            f"# ssh engine: {len(info['hosts'])} host(s), one node agent each; secrets are "
            "named only: their values go on the session's stdin",
            f"# the run's files: {files} (detected at run time unless ssh.shared_dir says)",
        ]
        for i, host in enumerate(info["hosts"]):
            out.append(f"# ---- node {i}: {ssh} -- {host} sh -c SCRIPT, SCRIPT:")
            out.append(node_script(info, i, 0).rstrip("\n"))
        job = job_text(node_job(loaded.spec, "RUN_ID"))
        out.append(f"# ---- {info['remote_run_dir']}/job.json (read by the node agent)")
        out += [f"# {line}" for line in job.splitlines()]
        return "\n".join(out) + "\n"

    def submit(self, sub: Submission, attach: bool) -> Submitted:
        from trebuchet.backends.job_file import write_job_files
        from trebuchet.store.files import write_json

        runtime, _ = write_job_files(sub.run_dir, node_job(sub.loaded.spec, sub.record.id))
        info = self.info(sub.loaded, sub.record.id, sub.run_dir, runtime.name)
        write_json(sub.run_dir / "ssh.json", info)
        if not attach:
            _start_detached(sub.store, sub.record.id, sub.run_dir)
            return Submitted(sub.record.id)
        from trebuchet.view.live import View

        view = View()
        run = SshRun(sub.run_dir, sub.store, view)
        run.install_signals()
        try:
            state = run.run()
        finally:
            view.close()
        rec = sub.store.get(sub.record.id) or sub.record
        return Submitted(rec.id, state, rec.exit_code, run.cancel_signal)

    def agents_share_run_dir(self, run: RunRecord) -> bool:
        """When the run directory was found shared with every host (ssh.json, as placed)."""
        from trebuchet.store.files import read_json

        info = read_json(Path(run.run_dir) / "ssh.json") or {}
        return info.get("remote_run_dir") == run.run_dir and info.get("remote_root") is None

    def refresh(self, store: Store, runs: list[RunRecord]) -> None:
        """As locally: a run whose supervisor vanished without an outcome is LOST."""
        from trebuchet.backends.local.engine import BACKEND as LOCAL

        LOCAL.refresh(store, runs)

    def cancel(self, store: Store, run: RunRecord) -> None:
        """As locally: SIGTERM to the supervisor, which closes every host's session."""
        from trebuchet.backends.local.engine import BACKEND as LOCAL

        LOCAL.cancel(store, run)


def merge_hang(adir: Path, expected: list[str]) -> bool:
    """Whether a node's hang watch stopped the attempt (runtime/node.py: each node watches
    its own ranks and dumps their stacks). Its hang.json then covers every rank whose stacks
    came back, from any node, so the diagnosis sees the whole run, not one node's ranks."""
    from trebuchet.store.files import read_json, write_json

    info = read_json(adir / "hang.json")
    if not isinstance(info, dict) or info.get("action") == "warn":
        return False
    stacks = sorted(p.stem for p in (adir / "stacks").glob("*.txt"))
    write_json(adir / "hang.json", {**info, "expected": expected, "stacks": stacks})
    return True


def _hex(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]+", text))


def _place(info: dict[str, Any], shared: bool) -> None:
    """Where the run's files are on the hosts: the run directory itself when shared, else
    the per-run copy (relative paths are the remote home's)."""
    rid, run_dir = info["run_id"], info["run_dir"]
    if shared:
        info["remote_root"] = None
        remote, workdir = run_dir, info["workdir"]
    else:
        remote, workdir = f"{info['remote_root'].rstrip('/')}/{rid}", "code"
    info.update(remote_run_dir=remote, remote_workdir=workdir)


def _start_detached(store: Store, run_id: str, run_dir: Path) -> None:
    log = os.open(run_dir / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trebuchet.backends.ssh.engine", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    finally:
        os.close(log)
    from trebuchet.runtime.procs import start_time

    store.update_run(
        run_id,
        only_if_active=True,
        supervisor_pid=proc.pid,
        supervisor_start=start_time(proc.pid),
        host=hostname(),
    )


class Node:
    """One host's session of one attempt: the ssh process and its output."""

    def __init__(self, index: int, host: str, proc: subprocess.Popen, log: IO[bytes]) -> None:
        self.index, self.host, self.proc, self.log = index, host, proc, log
        self.returncode: int | None = None
        self.closed = False
        self.reader: threading.Thread | None = None

    def close_session(self) -> None:
        """Close stdin: the remote agent stops its ranks (grace, then SIGKILL) and ends."""
        if not self.closed and self.proc.stdin:
            self.closed = True
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    @property
    def lost(self) -> bool:
        return self.returncode is not None and (self.returncode == 255 or self.returncode < 0)


class SshRun:
    """The supervisor of one ssh run (attached or detached)."""

    def __init__(self, run_dir: Path, store: Store, view: View | None = None) -> None:
        from trebuchet.launcher.index_records import IndexRecords
        from trebuchet.store.files import read_json

        self.run_dir = run_dir
        self.info: dict[str, Any] = read_json(run_dir / "ssh.json")
        self.store = store
        self.view = view
        self.rid = self.info["run_id"]
        self.control = ""
        self.notes: list[str] = []  # said by the main loop (reader threads append)
        self.nodes: list[Node] = []  # this attempt's sessions, one per host
        self.first: Node | None = None  # the first node to end badly: the root cause's
        self.kill_at: float | None = None  # sessions that did not end by then are cut
        self.cancel_said = False
        self.records = IndexRecords(store, self.rid, run_dir, self.say)
        self.job = JobController(settings(self.info, run_dir), self, self.records)

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
        """Run one command per host at once; (returncode, stdout, stderr) each."""
        procs = [
            subprocess.Popen(
                a,
                stdin=subprocess.PIPE if inputs else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for a in argvs
        ]
        out = []
        for i, p in enumerate(procs):
            so, se = p.communicate(inputs[i] if inputs else None)
            out.append((p.returncode, so, se.decode(errors="replace").strip()))
        return out

    def connect(self) -> str | None:
        """One master connection per host, all at once; why not, or None."""
        hosts = self.info["hosts"]
        logs = [open(self.run_dir / f"ssh-connect-{i}.log", "wb") for i in range(len(hosts))]  # noqa: SIM115
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
            codes = [p.wait() for p in procs]
        finally:
            for log in logs:
                log.close()
        for i, (h, rc) in enumerate(zip(hosts, codes, strict=True)):
            if rc != 0:
                text = (self.run_dir / f"ssh-connect-{i}.log").read_text(errors="replace").strip()
                return f"cannot connect to {h} (ssh exit {rc}): {text or 'no message'}"
        if not self.info["master_addr"]:
            out = subprocess.run(
                [*self.info["ssh"], "-G", "--", hosts[0]], capture_output=True, text=True
            ).stdout
            name = re.search(r"^hostname (\S+)$", out, re.M)
            self.info["master_addr"] = name.group(1) if name else hosts[0].rpartition("@")[2]
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
        for h, (rc, _, err) in zip(info["hosts"], results, strict=True):
            if rc != 0:
                return f"copying the run's files to {h}:{remote} failed (exit {rc}): {err}"
        self.say(f"code copied to {len(info['hosts'])} host(s) by {how} in {time.time() - t0:.2f}s")
        return None

    def disconnect(self) -> None:
        if not self.control:
            return
        self.each([[*self.opts(), "-O", "exit", "--", h] for h in self.info["hosts"]])
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

    # -- Nodes (runtime/lifecycle.py): this engine's side of each attempt -----------------
    def prepare(self) -> FirstFailure | None:
        """Connections to every host, then the run's files where they are not shared."""
        from trebuchet.store.files import write_json

        t0 = time.time()
        why = self.connect()
        if why is None:
            shared = self.shared()
            _place(self.info, shared)
            write_json(self.run_dir / "ssh.json", self.info)  # where the files are
            why = None if shared else self.copy()
            if shared:
                self.say("run directory shared with every host: nothing copied")
        if why is None:
            return None
        self.say(why)
        self.store.set_attempt(self.rid, 0, state="FAILED", started_at=t0, ended_at=time.time(),
                               reason=why)  # fmt: skip
        return cause("ssh", 255, 0, message=why)

    def attempt_facts(self, attempt: int) -> dict[str, Any]:
        return {"master": f"{self.info['master_addr']}:{self.info['master_port']}"}

    def pre_post(self, when: str, attempt: int) -> bool:
        """The spec's pre/post command on every host at once, each node's to its end (as
        locally), placed as the node agent is; its output in attempt-<n>/<when>-node-<i>.log.
        False when one failed."""
        command = self.info.get(when)
        if not command or self.job.cancel_signal is not None:
            return True
        adir = self.run_dir / f"attempt-{attempt}"
        hosts = self.info["hosts"]
        argvs = [self.ssh(h, remote_command(node_script(self.info, i, attempt, command)))
                 for i, h in enumerate(hosts)]  # fmt: skip
        results = self.each(argvs)
        for i, (_, out, err) in enumerate(results):
            (adir / f"{when}-node-{i}.log").write_bytes(out + err.encode())
        ok = all(rc == 0 for rc, _, _ in results)
        self.records.event(f"{when}_hooks", attempt=attempt, ok=ok)
        if not ok:
            self.say(f"{when} command failed on a node; see attempt-{attempt}/{when}-node-*.log")
        return ok

    def start(self, attempt: int) -> None:
        adir = self.run_dir / f"attempt-{attempt}"
        self.first, self.kill_at, self.cancel_said = None, None, False
        self.nodes = [self.start_node(i, h, attempt, adir)
                      for i, h in enumerate(self.info["hosts"])]  # fmt: skip
        if self.view:
            ppn = int(self.info["ppn"])
            for i in range(len(self.nodes)):
                for local in range(ppn):
                    self.view.add(f"{i}:{local}", adir / f"rank-{i * ppn + local}.log")

    def poll(self) -> bool:
        """A node that ends badly first names the root cause's node; the controller then
        stops the others."""
        for n in self.nodes:
            if n.returncode is None and n.proc.poll() is not None:
                n.returncode = n.proc.returncode
                if n.returncode != 0 and self.first is None and self.job.cancel_signal is None:
                    self.first = n
                    what = LOST if n.lost else f"node agent exited {n.returncode}"
                    self.say(f"node {n.index} ({n.host}): {what}: stopping the others")
                    self.job.failure(None)  # its record comes with the attempt's folder
        return any(n.returncode is None for n in self.nodes)

    def checkpoint(self, signum: int) -> int:
        return 0  # the node agents hold the timeout and its warning themselves

    def stop(self) -> None:
        """Close every session: each agent stops its ranks (grace, SIGKILL) and ends; a
        session still open after the grace period and 15 s is cut."""
        if self.job.cancel_signal is not None and not self.cancel_said:
            self.cancel_said = True
            self.say("cancelling: closing every host's session")
        for n in self.nodes:
            n.close_session()
        if self.kill_at is None:
            self.kill_at = time.time() + self.info["grace_period"] + 15

    def kill(self) -> None:
        for n in self.nodes:  # the session did not end: cut it (the agent sees EOF)
            if n.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(n.proc.pid, signal.SIGKILL)

    def tick(self) -> None:
        if self.kill_at is not None and time.time() > self.kill_at:
            self.kill()
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
        while self.notes:
            self.say(self.notes.pop(0))

    def ending(self, attempt: int, reason: str | None) -> Ending:
        adir = self.run_dir / f"attempt-{attempt}"
        hung = reason == "failure" and merge_hang(adir, expected_names(*self.job.settings.shape))
        state, found = self.outcome(self.nodes, self.first, reason, adir, attempt, hung)
        if found is not None:
            self.job.first_failure = found
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

    def start_node(self, i: int, host: str, attempt: int, adir: Path) -> Node:
        log = open(adir / f"ssh-{i}.log", "ab")  # noqa: SIM115 - closed by attempt()
        script = node_script(self.info, i, attempt)
        proc = subprocess.Popen(
            self.ssh(host, remote_command(script)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
        )
        node = Node(i, host, proc, log)
        secrets = {n: os.environ.get(n, "") for n in self.info["secrets"]}
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(secrets).encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass  # the session is already gone: its exit code says so
        node.reader = threading.Thread(target=self.read, args=(node, adir), daemon=True)
        node.reader.start()
        return node

    def read(self, node: Node, adir: Path) -> None:
        """The agent's stdout: `[n:l] line` goes to rank n*ppn+l's log (unless the ranks
        write the shared run directory themselves), `[n] line` to node-n.log, the rest
        (the agent's own `treb: ...` lines) to ssh-<node>.log and the terminal."""
        copy = self.info["remote_root"] is not None
        ppn = int(self.info["ppn"])
        files: dict[str, IO[bytes]] = {}
        assert node.proc.stdout is not None
        try:
            for line in node.proc.stdout:
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
        """The node's attempt folder (records, exact logs, stacks, metrics) from its host,
        into `adir`."""
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
                if not member.isfile() or not re.fullmatch(r"((stacks|metrics)/)?[\w.-]+", name):
                    continue  # the folder's files, stacks, metrics (no paths from the host)
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
                rec.setdefault("host", self.info["hosts"][int(rec.get("node") or 0)])
                records.append(cast("Outcome", rec))
        self.store.set_procs(self.rid, attempt, records)
        if reason == "cancel":
            return "CANCELLED", None
        if first is None:
            return "SUCCEEDED", None
        if first.lost:
            what = f"the ssh connection to {first.host} was lost (ssh exit {first.returncode})"
            log = str(adir / f"ssh-{first.index}.log")
            return "FAILED", cause(f"node {first.index}", 255, attempt, first.index,
                                   host=first.host, log=log, message=what)  # fmt: skip
        mine = [r for r in records if (r.get("node") or 0) == first.index]
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


BACKEND = SshBackend()


def settings(info: dict[str, Any], run_dir: Path) -> Settings:
    """What the job controller reads of ssh.json: the node agents hold the timeout and
    watch their own ranks for hangs, so the controller does neither."""
    return Settings(
        retries=info["retries"], log_policies=info.get("log_policies", []),
        on_hang=info.get("on_hang") or "fail", hang_timeout=None, timeout=None, warning=None,
        checkpoint_signal=int(signal.SIGUSR2), grace=float(info["grace_period"]),
        shape=(info["launcher"], len(info["hosts"]), int(info["ppn"])),
        run_dir=str(run_dir),
    )  # fmt: skip


def main(argv: list[str]) -> int:
    """A detached run's supervisor."""
    from trebuchet.store.db import Store

    store = Store()
    run = SshRun(Path(argv[-1]), store)
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
