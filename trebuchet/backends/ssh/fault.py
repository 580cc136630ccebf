"""`treb fault` on ssh: the runtime's fault verb run on the host, in the run's folder there
(the session's ssh argv and hosts from the run's ssh.json)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, cast

from trebuchet.errors import UserError
from trebuchet.runtime.node import fault
from trebuchet.runtime.rundir.records import read_json

if TYPE_CHECKING:
    from trebuchet.backends.ssh.script import SshFacts
    from trebuchet.store.db import RunRecord

STEP_TIMEOUT_S = 120.0


def ssh_info(run_dir: Path) -> SshFacts:
    """The run's ssh.json (its hosts, remote folder, runtime, ssh argv); UserError when it
    is unreadable or incomplete (a rank can reach the run directory)."""
    info = read_json(str(run_dir / "ssh.json"))
    texts = lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v)  # noqa: E731
    if not (isinstance(info, dict) and texts(info.get("hosts")) and texts(info.get("ssh"))
            and isinstance(info.get("remote_run_dir"), str)
            and isinstance(info.get("runtime"), str)):  # fmt: skip
        raise UserError(f"{run_dir / 'ssh.json'}: unreadable or incomplete (the run's ssh facts)")
    return cast("SshFacts", info)


def nodes(run: RunRecord) -> list[str]:
    from trebuchet.backends.ssh.script import attempt_hosts

    return attempt_hosts(ssh_info(Path(run.run_dir)))


def _on_host(run: RunRecord, host: str, words: list[str]) -> int:
    """The runtime's fault verb on an ssh host (in the run's folder there)."""
    info = ssh_info(Path(run.run_dir))
    remote = info["remote_run_dir"]
    cmd = f"cd {shlex.quote(remote)} && python3 -S ./{shlex.quote(info['runtime'])} fault " + \
        " ".join(shlex.quote(w) for w in words)  # fmt: skip
    return subprocess.run([*info["ssh"], "--", host, cmd], timeout=STEP_TIMEOUT_S).returncode


def inject(run: RunRecord, action: str, target: str | None, node: int | None,
           host: str | None) -> int:  # fmt: skip
    rid = run.id
    if action == fault.KILL_NODE:
        assert host is not None
        return _on_host(run, host, [fault.KILL_NODE, rid, str(node)])
    hosts = nodes(run)
    if action == fault.HANG_RANK:
        on = hosts[int(str(target)) // int(run.procs_per_node or 1)]
        return _on_host(run, on, [fault.HANG_RANK, ".", rid, str(target)])
    codes = [_on_host(run, h, [fault.PREEMPT, ".", rid]) for h in hosts]
    return 0 if 0 in codes else 1
