"""The ssh engine's connections and the run's files on its hosts: what a run needs of ssh
whatever its attempts do (the sessions are run.py's).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trebuchet.backends.ssh.script import (
    LOGIN_S,
    PERSIST_S,
    SshFacts,
    connect_timeout,
    master_address,
)
from trebuchet.runtime.rundir.regular import read_text


class Hosts:
    """A run's ssh connections to its hosts and its files there."""

    def __init__(self, info: SshFacts, run_dir: Path, cancelled: Callable[[], bool],
                 nap: Callable[[float], None], say: Callable[[str], None]) -> None:  # fmt: skip
        self.info, self.run_dir = info, run_dir
        self._cancelled, self.nap, self.say = cancelled, nap, say
        self.control = ""  # the master connections' sockets (a folder made by the run)
        self.remote_stops: list[subprocess.Popen] = []  # stop signals on their way to hosts

    @property
    def cancelled(self) -> bool:
        return self._cancelled()

    def opts(self, master: bool = False) -> list[str]:
        """ssh and its options, through this run's shared connections."""
        mode = ["-M", "-N", "-f"] if master else ["-o", "ControlMaster=auto"]
        return [*self.info["ssh"], *mode, "-o", f"ControlPath={self.control}/%C",
                "-o", f"ControlPersist={PERSIST_S}"]  # fmt: skip

    def ssh(self, host: str, *words: str) -> list[str]:
        return [*self.opts(), "--", host, *words]

    def each(self, argvs: list[list[str]], inputs: list[bytes] | None = None) -> list[tuple]:
        """Run one command per host at once; (returncode, stdout, stderr) each. A cancel
        kills them (the caller looks at the cancel)."""
        procs = [
            subprocess.Popen(
                a,
                stdin=subprocess.PIPE if inputs else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
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
        LOGIN_S for the login (a host that answers and then stalls is cut); why not."""
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
                )  # fmt: skip
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
        """Is the run directory the same folder on every host (a token written here, read there)?"""
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
        """The code, the runtime and job.json to every host's per-run folder (rsync, else
        tar); why not."""
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
            results = self.each([self.ssh(h, cmd) for h in info["hosts"]],
                                [data] * len(info["hosts"]))  # fmt: skip
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
