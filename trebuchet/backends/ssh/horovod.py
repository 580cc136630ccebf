"""`launcher: horovod` over ssh: where node 0's horovodrun reaches the other hosts.

Why: horovodrun starts the ranks on the other hosts through its own ssh, which knows no
`ssh -F` config and no host aliases: it needs their addresses, and the port and identity
the ssh engine connects with (`ssh -G`), handed to node 0 in job.json.
"""

from __future__ import annotations

import os
import re

from trebuchet.backends.ssh.script import ssh_config
from trebuchet.runtime.contracts.schema import HorovodHosts


def resolve(ssh: list[str], host: str) -> dict[str, str]:
    """`ssh -G host`'s hostname, port and first existing identity file."""
    found = {"hostname": host.rpartition("@")[2]}
    out = ssh_config(ssh, host)
    for key, value in re.findall(r"^(hostname|port|identityfile) (.+)$", out, re.M):
        if key == "identityfile":
            path = os.path.expanduser(value)
            if "identityfile" not in found and os.path.isfile(path):
                found["identityfile"] = path
        else:
            found[key] = value
    return found


def placement(ssh: list[str], hosts: list[str]) -> HorovodHosts:
    """The hosts' addresses, node 0's port and identity (horovodrun takes one of each)."""
    seen = [resolve(ssh, h) for h in hosts]
    port = seen[0].get("port", "")
    return {
        "hosts": [s["hostname"] for s in seen],
        "port": int(port) if port.isdigit() else None,
        "identity": seen[0].get("identityfile"),
    }
