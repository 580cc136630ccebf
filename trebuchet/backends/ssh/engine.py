"""SSH: machines without a scheduler. One node agent per host, started with the system `ssh`.

The run is supervised on the submitting machine, as locally (run.py). One connection per
host, opened in parallel and shared by every later command (ControlMaster): a 16-host
launch costs one round of handshakes, not 16 in a row. The run's files are copied to the
hosts unless the run directory is on a shared filesystem. Secrets travel on the session's
stdin, never on a command line; that stdin is also the agent's lifeline: its end (a cancel,
a dropped connection, this process's death) stops the agent's ranks, so nothing outlives
the session on any host. Until the agent runs, the session's process group on the host is
known, so a stop ends a session still in setup there too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import Submitted
from trebuchet.backends.job_file import (
    check_node_engine,
    controller_job,
    engine_options,
    job_text,
    node_job,
    uses_secret,
)
from trebuchet.backends.supervised_here import SupervisedHere, signals_lent, start_detached
from trebuchet.errors import UserError
from trebuchet.runtime.rundir.regular import read_text

if TYPE_CHECKING:
    from trebuchet.backends.ssh.options import Ssh
    from trebuchet.backends.ssh.script import SshFacts
    from trebuchet.launcher.submit import Submission
    from trebuchet.preflight.context import Context
    from trebuchet.preflight.findings import Finding
    from trebuchet.runtime.contracts.schema import JobFile
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord
from trebuchet.backends.ssh.script import (
    _HOST,
    attempt_hosts,
    master_address,
    node_script,
    place,
    setup_syntax,
    ssh_argv,
)

# `gpu1:2222`, `[gpu1]:2222`, `[::1]:22`: a port after the host, which OpenSSH takes as part
# of the name (an IPv6 address has two colons or more, unbracketed)
_PORTED = re.compile(r"\[([^\[\]]+)\]:([0-9]+)|([^:\[\]]+):([0-9]+)")


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
            text = read_text(path)  # a regular file only: a FIFO there never blocks
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


class SshBackend(SupervisedHere):
    name = "ssh"
    faults = True

    def _hosts(self, loaded: LoadedSpec, say: bool = False) -> list[Host]:
        """The hosts the run holds (`nodes`, then `spare_nodes` spares), those with a bad
        history across runs skipped when more are listed (avoid.py)."""
        from trebuchet.backends.ssh.avoid import choose

        spec = loaded.spec
        found = self._all_hosts(loaded)
        return choose(found, [h.name for h in found], spec.nodes + spec.spare_nodes,
                      spec.allow_nodes, loaded.where("ssh", "hosts"), say)  # fmt: skip

    def _all_hosts(self, loaded: LoadedSpec) -> list[Host]:
        spec = loaded.spec
        found = hosts(loaded)
        if not found:
            raise UserError(f"{loaded.where('ssh')}: ssh: give ssh.hosts or ssh.hostfile")
        for h in found:
            if not _HOST.fullmatch(h.name) or h.name.startswith("-"):
                raise UserError(f"{h.where}: {h.name!r} is not a host name")
            if m := _PORTED.fullmatch(h.name.rsplit("@", 1)[-1]):
                name, port = m[1] or m[3], m[2] or m[4]
                raise UserError(
                    f"{h.where}: {h.name!r}: ssh reads `host:port` as a host name, not a "
                    f"port: give the port as ssh.port (every host: ssh -p {port}) or in "
                    f"~/.ssh/config (`Host {name}` then `Port {port}`), and list the host "
                    "alone"
                )
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
        if len(found) < spec.nodes + spec.spare_nodes:
            raise UserError(
                f"{loaded.where('spare_nodes')}: spare_nodes: {spec.spare_nodes} needs "
                f"{spec.nodes + spec.spare_nodes} hosts (nodes {spec.nodes} + the spares, "
                f"listed after them), but ssh names only {len(found)}"
            )
        return found

    def check(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        self._hosts(loaded)
        check_node_engine(spec, loaded, "ssh", horovod=True)
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

    def info(self, loaded: LoadedSpec, run_id: str, run_dir: Path, runtime: str) -> SshFacts:
        """What this engine adds to the job file (ssh.json)."""
        spec = loaded.spec
        sp: Ssh = engine_options(spec, "ssh")
        names = [h.name for h in self._hosts(loaded, say=True)]
        env = {k: v for k, v in spec.env.items() if not uses_secret(v, spec.secrets)}
        return {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "hosts": names,
            "ssh": ssh_argv(sp),
            "shared": sp.shared_dir,  # None: detect; "none": copy; a path: shared
            "remote_root": sp.remote_dir,
            "workdir": str(loaded.workdir),
            "runtime": runtime,
            "master_addr": sp.master_addr or "",
            "master_addr_given": sp.master_addr or "",
            "nodes": spec.nodes,  # node loss (docs/recovery.md): hosts beyond it are spares
            "master_port": master_port(spec, run_id),
            "env": env,
            "setup": list(sp.setup),
            "setup_where": setup_where(loaded, len(sp.setup)),
        }

    def render(self, loaded: LoadedSpec) -> str:
        from trebuchet.launcher.runtime_file import file_name
        from trebuchet.store.paths import runs_dir

        run_dir = runs_dir() / "RUN_ID"
        info = self.info(loaded, "RUN_ID", run_dir, file_name())
        place(info, shared=info["shared"] not in (None, "none"))
        info["master_addr"] = master_address(info)  # as the run resolves it
        pinned = loaded.spec.fixed_port is not None
        if not pinned:
            info["master_port"] = "RUN_PORT"
        ssh = " ".join(shlex.quote(a) for a in info["ssh"])
        files = "shared: nothing copied" if info["remote_root"] is None else "copied to each host"
        port = (
            "MASTER_PORT: pinned by the spec"
            if pinned
            else "RUN_PORT: MASTER_PORT, 15000 + (the run id, hex) % 10000, known at "
            "submission (master_port or env.MASTER_PORT pins it)"
        )
        out = [
            f"# ssh engine: {len(attempt_hosts(info))} host(s), one node agent each; secrets are "
            "named only: their values go on the session's stdin",
            f"# the run's files: {files} (detected at run time unless ssh.shared_dir says)",
            f"# RUN_ID: the run's id, made at submission; {port}; MASTER_ADDR: "
            + ("ssh.master_addr" if engine_options(loaded.spec, "ssh").master_addr else
               f"node 0's HostName as `ssh -G {attempt_hosts(info)[0]}` resolves it"),
            "# TREB_ATTEMPT_ELAPSED: the attempt's seconds before the session (its `pre`): "
            "the agent's timeout counts from the attempt's start",
        ]  # fmt: skip
        spares = info["hosts"][len(attempt_hosts(info)) :]
        if spares:
            out.append(f"# spares (node loss, docs/recovery.md): {', '.join(spares)}")
        for i, host in enumerate(attempt_hosts(info)):
            out.append(f"# ---- node {i}: {ssh} -- {host} bash -c SCRIPT, SCRIPT:")
            out.append(node_script(info, i, 0).rstrip("\n"))
        job = job_text(ssh_job(loaded.spec, "RUN_ID", run_dir))
        out.append(f"# ---- {info['remote_run_dir']}/job.json (read by the node agent)")
        out += [f"# {line}" for line in job.splitlines()]
        return "\n".join(out) + "\n"

    def preflight(self, ctx: Context) -> list[Finding]:
        """Hosts listed beyond those held, and ssh.setup lines bash cannot parse."""
        from trebuchet.preflight.findings import ERROR, WARNING, Finding

        out: list[Finding] = []
        try:
            found = self._all_hosts(ctx.loaded)
        except UserError:
            found = []  # the engine's check refuses them (backend-refuses)
        nodes = ctx.spec.nodes
        spare = ctx.spec.spare_nodes
        held = nodes + spare
        if len(found) > held:
            unused = [h.name for h in found[held:]]
            out.append(Finding(
                "ssh-hosts-unused", WARNING,
                f"{len(found)} hosts are listed but nodes is {nodes}"
                + (f" and spare_nodes {spare}: only the first {held} are held" if spare else
                   f": only the first {nodes} run the job")
                + f"; {', '.join(unused)} {'goes' if len(unused) == 1 else 'go'} unused ("
                + ("beyond the spares" if spare else "no spares: spare_nodes is 0, so a host "
                   "that fails is not replaced") + ")",
                f"set `nodes: {len(found)}` to use them all, `spare_nodes: "
                f"{len(found) - nodes}` to hold them as spares, or remove the hosts not meant "
                "for this run", found[held].where,
            ))  # fmt: skip
        sp: Ssh = engine_options(ctx.spec, "ssh")
        bad = setup_syntax(list(sp.setup))
        if bad is not None:
            i, why = bad
            out.append(ctx.finding(
                "ssh-setup-syntax", ERROR,
                f"ssh.setup: bash cannot parse item {i + 1} ({sp.setup[i]!r}): {why}",
                "fix the shell syntax: bash runs ssh.setup on each host before the node agent, "
                "item after item in one shell, under errexit and pipefail", "ssh", "setup", i,
            ))  # fmt: skip
        return out

    def submit(self, sub: Submission, attach: bool) -> Submitted:
        from trebuchet.backends.job_file import write_job_files
        from trebuchet.store.files import write_json

        job = ssh_job(sub.loaded.spec, sub.record.id, sub.run_dir)
        info = self.info(sub.loaded, sub.record.id, sub.run_dir, "")
        if sub.loaded.spec.launcher == "horovod":  # node 0's horovodrun reaches the hosts
            from trebuchet.backends.ssh.horovod import placement

            job["horovod"] = placement(info["ssh"], info["hosts"])
        runtime, _ = write_job_files(sub.run_dir, job)
        info["runtime"] = runtime.name
        write_json(sub.run_dir / "ssh.json", info)  # the engine's facts beside job.json
        if not attach:
            start_detached(sub.store, sub.record.id, sub.run_dir, "trebuchet.backends.ssh.run")
            return Submitted(sub.record.id)
        from trebuchet.backends.ssh.run import SshRun
        from trebuchet.view.live import View

        view = View()
        run = SshRun(sub.run_dir, sub.store, view)
        with signals_lent():
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

    def fault_nodes(self, run: RunRecord) -> list[str]:
        from trebuchet.backends.ssh import fault

        return fault.nodes(run)

    def inject_fault(self, run: RunRecord, action: str, target: str | None, node: int | None,
                     host: str | None) -> int:  # fmt: skip
        from trebuchet.backends.ssh import fault

        return fault.inject(run, action, target, node, host)


def ssh_job(spec: Any, run_id: str, run_dir: Path) -> JobFile:
    """What the job controller here and the node agents on the hosts read. The controller
    holds the timeout from the attempt's start: a slow setup counts."""
    job = node_job(spec, run_id, job=controller_job(spec, run_id, run_dir))
    job["nodes_watch"] = True
    return job


def setup_where(loaded: LoadedSpec, count: int) -> list[str]:
    """Each ssh.setup item's file:line (or the -o that set it), to name a failing one."""
    where: Any = loaded.where  # the key path holds the item's index, an int
    return [where("ssh", "setup", i) for i in range(count)]


def _hex(text: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]+", text))


def master_port(spec: Any, run_id: str) -> int:
    """A port per run (from its id, as Slurm's from the job id): two runs sharing a host
    rarely collide."""
    if spec.fixed_port:
        return int(spec.fixed_port)
    return 15000 + int(run_id, 16) % 10000 if _hex(run_id) else 29500


BACKEND = SshBackend()
