"""The spec's `ssh:` block: what only the SSH engine reads (engine.py)."""

from __future__ import annotations

from trebuchet.spec.model import Block, allowed


class Ssh(Block):
    """SSH-specific settings (machines without a scheduler)"""

    hosts: list[str] = allowed(
        "a list of host names",
        "the hosts, node 0 first ([user@]host); the first `nodes` are used",
        default_factory=list,
    )  # fmt: skip
    hostfile: str | None = allowed(
        "a path",
        "a file of hosts, one a line (DeepSpeed's `host slots=N` accepted), relative to the spec",
        default=None,
    )
    user: str | None = allowed("a user name", "ssh -l (default: ssh's own)", default=None)
    port: int | None = allowed("a port number", "ssh -p", default=None, ge=1, le=65535)
    identity_file: str | None = allowed("a path", "ssh -i", default=None)
    config_file: str | None = allowed("a path", "ssh -F (default: ~/.ssh/config)", default=None)
    options: list[str] = allowed(
        "a list of ssh -o options such as ConnectTimeout=10", "ssh -o, each",
        default_factory=list,
    )  # fmt: skip
    shared_dir: str | None = allowed(
        "a path, or none",
        "a folder every host sees at the same path, holding TREB_HOME: nothing is copied "
        "(default: detected; none: always copy)",
        default=None,
    )
    remote_dir: str = allowed(
        "a path",
        "where each run's copy goes on the hosts (relative: to the remote home)",
        default=".trebuchet/ssh-runs",
    )
    master_addr: str | None = allowed(
        "an address", "MASTER_ADDR (default: node 0's address from ssh's config)", default=None
    )
    setup: list[str] = allowed(
        "a list of shell lines",
        "lines bash runs on each host before the node agent, in one shell with errexit and "
        "pipefail (e.g. `source venv/bin/activate`): a failing line fails the node before "
        "any rank starts",
        default_factory=list,
        expand=False,
    )
