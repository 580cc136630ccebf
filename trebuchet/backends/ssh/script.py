"""What the ssh engine runs on a host, and how it reaches it: the ssh command line, the
per-attempt node script and the markers it prints before the agent takes its stdout over.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
from typing import Any, TypedDict

from trebuchet.runtime.node.per_node import SETUP_ENV_FD, SETUP_ENV_VAR
from trebuchet.runtime.node.task import NO_PYTHON

CONNECT_TIMEOUT_S = 20  # ssh's ConnectTimeout unless ssh.options gives one
LOGIN_S = 5  # beyond ConnectTimeout, for the login itself: a host that stalls after its banner
PERSIST_S = 15  # a master outlives its last session this long (a killed supervisor's too)
# What a session's script says on its stdout before the node agent (or a pre/post command)
# takes it over; nothing else writes there until then (setup's output goes to its log):
SESSION = "treb-session"  # the first line: the session's process group on the host
SETUP_DONE = "treb-setup-done"  # setup is over: the agent (or the command) starts now
SETUP_FAILED = "treb-setup-failed"  # ssh.setup ended the shell: its item (from 1), exit code
SETUP_OUTPUT = "treb-setup-output"  # then the last lines of setup's output, one each
SETUP_TAIL = 20
_HOST = re.compile(r"[A-Za-z0-9_.@:\[\]%-]+")  # no option (leading -), space or shell syntax


def ssh_argv(sp: Any) -> list[str]:
    """`ssh` with the spec's settings (a run adds its shared connection: hosts.py)."""
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
    return [*argv, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]


def connect_timeout(argv: list[str]) -> float:
    """The ConnectTimeout ssh applies: the first `-o ConnectTimeout=N` (ssh.options come
    before trebuchet's default), which wins over any config file."""
    for i, word in enumerate(argv[:-1]):
        key, _, value = argv[i + 1].partition("=")
        if word == "-o" and key.strip().lower() == "connecttimeout":
            with contextlib.suppress(ValueError):
                return max(1.0, float(value))
    return float(CONNECT_TIMEOUT_S)


def setup_body(setup: list[str]) -> list[str]:
    """The items of ssh.setup, each after the line that numbers it: a failure names it."""
    body: list[str] = []
    for i, item in enumerate(setup, 1):
        body += [f"_treb_line={i}", item]
    return body


def setup_lines(setup: list[str], log: str | None) -> list[str]:
    """ssh.setup in the session's own shell (so `source .../activate` holds for what
    follows), stdin from /dev/null (the secrets' line is the agent's). A line that fails
    ends the shell: the EXIT trap says which item and the last lines of its output on the
    session's stdout (fd 9), and the node ends before any rank starts."""
    if not setup:
        return []
    tail = (
        f"tail -n {SETUP_TAIL} {log} 2>/dev/null | while IFS= read -r _treb_l; do "
        f"printf '{SETUP_OUTPUT} %s\\n' \"$_treb_l\"; done >&9; "
        if log
        else ""
    )
    return [
        "exec 9>&1",
        "_treb_line=0",
        "_treb_setup_end() { _treb_rc=$?; trap - EXIT; set +e +o pipefail; "
        f'echo {SETUP_FAILED} "$_treb_line" "$_treb_rc" >&9; {tail}'
        '[ "$_treb_rc" != 0 ] || _treb_rc=1; exit "$_treb_rc"; }',
        "trap _treb_setup_end EXIT",
        "set -e -o pipefail",
        "{",
        *setup_body(setup),
        "}" + (f" >{log} 2>&1" if log else "") + " </dev/null",
        "set +e +o pipefail",
        "trap - EXIT",
        "exec 9>&-",
    ]


class SshFacts(TypedDict, total=False):
    """ssh.json: what the ssh engine adds to the job file, the facts of where the run is."""

    run_id: str
    run_dir: str
    hosts: list[str]
    ssh: list[str]
    shared: str | None  # None: detect; "none": copy; a path: shared
    remote_root: str | None
    workdir: str
    runtime: str
    master_addr: str
    master_addr_given: str
    nodes: int
    master_port: int | str  # "RUN_PORT" in a render
    env: dict[str, str]
    setup: list[str]
    setup_where: list[str]
    remote_run_dir: str  # placed (`place`)
    remote_workdir: str
    active: list[str]  # this attempt's hosts, node 0 first


def node_script(
    info: SshFacts, node: int, attempt: int, hook: str | None = None, elapsed: float = 0.0
) -> str:
    """What `bash -c` runs on host `node`: the session's process group first (a stop before
    the agent runs ends it there), the setup lines, then the node agent in place of the
    shell (`hook`: the spec's pre or post command instead). `elapsed`: the attempt's seconds
    before this session, since the agent's timeout counts from the attempt's start."""
    q = shlex.quote
    env = {
        **info["env"],
        "NODE_RANK": str(node),
        "NUM_NODES": str(len(attempt_hosts(info))),
        "MASTER_ADDR": info["master_addr"],
        "MASTER_PORT": str(info["master_port"]),
        "TREB_RUN_ID": info["run_id"],
        "TREB_RUN_DIR": info["remote_run_dir"],
        "TREB_ATTEMPT": str(attempt),
        **({} if hook else {"TREB_NODE_STDIN": "1", "TREB_ATTEMPT_ELAPSED": f"{elapsed:.3f}"}),
        # ranks started by bash would source ~/.bashrc again (bash does so when it sees
        # SSH_CLIENT at level 1), undoing ssh.setup's PATH: the login shell did it once
        "SHLVL": "1",
    }
    del env["TREB_RUN_DIR"]  # from the run folder itself: a relative remote_dir is $HOME's
    adir = f'"$TREB_RUN_DIR"/attempt-{attempt}'
    log = None if hook else f"{adir}/setup-node-{node}.log"
    lines = [
        f"read -r _ _ _ _ _treb_pg _ < /proc/$$/stat && echo {SESSION} \"$_treb_pg\"",
        'read -r _treb_up _ < /proc/uptime || _treb_up=""',
        f"cd {q(info['remote_run_dir'])} || exit 2",
        'TREB_RUN_DIR="$PWD"',
        *([] if hook or not info["setup"] else [f"mkdir -p -m 700 {adir} || exit 2"]),
        f"cd {q(info['remote_workdir'])} || exit 2",
        *setup_lines(info["setup"], log),
        *[f"export {k}={q(v)}" for k, v in env.items()],
        "export TREB_RUN_DIR",
        *([f"echo {SETUP_DONE}", f"exec bash -c {q(hook)}"] if hook else [
            'export TREB_SESSION_UPTIME="$_treb_up"',
            NO_PYTHON,
            f"echo {SETUP_DONE}",
            # the environment setup made, as it is now: whatever runs `python3` (a pyenv
            # shim prepends its own PATH) the agent gives its ranks this one (SETUP_ENV_FD)
            f"export {SETUP_ENV_VAR}={SETUP_ENV_FD}",
            f'exec python3 -S "$TREB_RUN_DIR"/{q(info["runtime"])} node "$TREB_RUN_DIR"/job.json'
            f" {SETUP_ENV_FD}< <(env -0)",
        ]),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def remote_command(script: str) -> str:
    """The one word ssh hands to the remote login shell (bash, zsh, dash alike)."""
    return "bash -c " + shlex.quote(script)


def attempt_hosts(info: SshFacts) -> list[str]:
    """The hosts of the current attempt, node 0 first: what the supervisor chose after a
    loss (`active`), else the first `nodes` of those listed."""
    hosts: list[str] = info.get("active") or info["hosts"][: info.get("nodes") or None]
    return hosts


def master_address(info: SshFacts) -> str:
    """MASTER_ADDR: ssh.master_addr, else node 0's HostName as `ssh -G` resolves it (no
    connection is made). Node 0 is the attempt's: the master moves when it was lost."""
    given = info.get("master_addr_given", info["master_addr"])
    if given:
        return str(given)
    host = attempt_hosts(info)[0]
    name = re.search(r"^hostname (\S+)$", ssh_config(info["ssh"], host), re.M)
    return name.group(1) if name else host.rpartition("@")[2]


def ssh_config(ssh: list[str], host: str) -> str:
    """`ssh -G host`: the settings ssh's config gives it (no connection is made)."""
    try:
        return subprocess.run([*ssh, "-G", "--", host], capture_output=True, text=True,
                              timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""


def setup_syntax(setup: list[str]) -> tuple[int, str] | None:
    """(item index, bash's message) where `bash -n` here cannot parse ssh.setup as the node's
    script holds it (bash on the hosts parses the same way)."""
    bash = shutil.which("bash")
    if not bash or not setup:
        return None
    body = setup_body(setup)
    try:
        res = subprocess.run([bash, "-n", "-c", "\n".join(["{", *body, "}"])], text=True,
                             capture_output=True, timeout=10, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode == 0:
        return None
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    at = re.search(r"line (\d+)", lines[0]) if lines else None
    item = len(setup) - 1  # an unclosed construct: bash reports the end
    if at:
        row = int(at.group(1)) - 2  # into body (line 1 is the `{`)
        starts = [i for i, b in enumerate(body) if b.startswith("_treb_line=")]
        item = max([k for k, start in enumerate(starts) if start <= row] or [0])
    words = [re.sub(r"^\S*bash: (?:-c: )?(?:line \d+: )?", "", ln) for ln in lines]
    return item, "; ".join(dict.fromkeys(w for w in words if w)) or f"exit {res.returncode}"


def place(info: SshFacts, shared: bool) -> None:
    """Where the run's files are on the hosts (relative paths are the remote home's)."""
    rid, run_dir = info["run_id"], info["run_dir"]
    if shared:
        info["remote_root"] = None
        remote, workdir = run_dir, info["workdir"]
    else:
        remote, workdir = f"{str(info['remote_root']).rstrip('/')}/{rid}", "code"
    info["remote_run_dir"], info["remote_workdir"] = remote, workdir
