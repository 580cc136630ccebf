"""A node's health checks, before each attempt's ranks join (every engine's node agent
runs them: Slurm's task, the node verb of ssh/SkyPilot/Kubernetes, the local supervisor
per simulated node). Why: a node with a full disk, a missing GPU, a run directory that is
not the shared one or no route to the master would fail the attempt minutes later, in
the ranks' rendezvous or at their first checkpoint, with a cause far from the node.

The checks (each cheap; together a few milliseconds without the spec's own):

- `runtime`: this interpreter started and runs this code (its version recorded);
- `disk`: at least MIN_FREE_BYTES free, and writable, in the run dir, the workdir and the
  checkpoint dir (its parent when it does not exist yet);
- `shared`: the run dir is the one the controller writes (Slurm: the attempt's
  attempt.json, written by the controller before the step, readable here and naming this
  job and attempt); elsewhere the attempt directory exists and is writable;
- `gpus`: where GPUs are asked (gpus_per_node > 0), `nvidia-smi -L` (else `rocm-smi
  --showid`) lists at least that many (a node with neither tool: not checked, said so);
- `master`: MASTER_ADDR resolves and this node has a route to it (a UDP socket's connect:
  a route lookup, no packet sent). Nothing connects to MASTER_PORT or any other port of
  the master: the port is the user's program's (a rank with its own rendezvous on it, or
  one already started on another node, would take the check for a peer);
- `user`: the spec's `health_check`, in bash in the workdir with the rank contract's node
  variables; non-zero or past health_check_timeout is unhealthy; its output goes to
  `attempt-N/health-<node>.log`.

Results: `attempt-N/health-<node>.json` (written, then renamed). A healthy node's agent
then waits for every node's verdict before it starts a rank (barrier.py: no rank runs
while another node still checks). An unhealthy node starts no rank, nor does any other;
it is then handled as a lost node: `attempt-N/lost-<node>.json` with label
`node_unhealthy` and a message naming the failing check, the `node_unhealthy` event and
the node's exclusion for the rest of the run: nodeloss.record, the one path of a lost
node's record (the engines' first failure, `treb status`, `treb diagnose` read it).

Stdlib only, Python >= 3.8 (runtime file).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time

from ..rundir.records import read_json, write_json, write_text
from ..rundir.regular import read_text
from . import barrier

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, NamedTuple
else:
    from ..contracts.named import NamedTuple

MIN_FREE_BYTES = 1 << 20  # a full disk: under 1 MiB free in the run dir, workdir, checkpoints
MASTER_WAIT_S = 30.0  # a master not reached is tried again this long (its pod may start)
GPU_LIST_S = 20.0  # nvidia-smi -L on a busy node
OUTPUT_MAX = 64 << 10  # the kept end of the spec's check's output
LABEL = "node_unhealthy"
TOKEN_FILE = "health-token"  # `treb check --nodes`: written by treb, read by every node


class Check(NamedTuple):
    name: str
    ok: bool
    detail: str
    seconds: float


class Where(NamedTuple):
    """One node of one attempt: what the checks look at."""

    run_dir: str
    adir: str  # run_dir/attempt-N
    attempt: int
    node: int  # its index in the attempt (NODE_RANK)
    host: str  # its name, as the engine names it (nodeset's exclusions)
    workdir: str
    env: Mapping[str, str]  # the node's rank contract (MASTER_ADDR, TREB_CHECKPOINT_DIR...)


def _timed(name: str, fn: Callable[[], tuple[bool, str]]) -> Check:
    t0 = time.monotonic()
    try:
        ok, detail = fn()
    except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return Check(name, ok, detail, round(time.monotonic() - t0, 6))


def check_runtime() -> tuple[bool, str]:
    v = sys.version_info
    return True, f"python {v[0]}.{v[1]}.{v[2]} ({sys.executable})"


def check_disk(paths: Mapping[str, str], min_free: int = MIN_FREE_BYTES) -> tuple[bool, str]:
    """Free space and write access where the run writes (a missing checkpoint dir: the
    nearest folder above it, where it will be made)."""
    said, bad = [], []
    for what, path in paths.items():
        at = path
        while at and not os.path.isdir(at) and os.path.dirname(at) != at:
            at = os.path.dirname(at)
        try:
            st = os.statvfs(at)
        except OSError as exc:
            bad.append(f"{what} {path}: {exc.strerror}")
            continue
        free = st.f_bavail * st.f_frsize
        said.append(
            f"{what} {free / (1 << 30):.1f} GiB free"
            if free >= 1 << 30
            else f"{what} {free / (1 << 20):.1f} MiB free"
        )
        if free < min_free:
            bad.append(f"{what} {path}: {free / (1 << 20):.1f} MiB free, under "
                       f"{min_free / (1 << 20):.0f} MiB")  # fmt: skip
        elif not os.access(at, os.W_OK):
            bad.append(f"{what} {at}: not writable")
    return (False, "; ".join(bad)) if bad else (True, ", ".join(said))


def check_shared(where: Where, slurm_job: str | None, token: str | None = None) -> tuple[bool, str]:
    """Slurm: the controller's attempt.json of this job and attempt is readable here (a
    node-local folder at the same path would not have it); `treb check --nodes`: the
    token file it wrote holds `token`; elsewhere the attempt folder exists and is
    writable (the run dir is the node's own over ssh, when not shared)."""
    if token is not None:
        try:
            found = read_text(os.path.join(where.run_dir, TOKEN_FILE), 4096).strip()
        except OSError as exc:
            return False, f"{where.run_dir}/{TOKEN_FILE}: {exc.strerror}: not the shared folder"
        if found != token:
            return False, f"{where.run_dir}/{TOKEN_FILE} holds another token: not the shared folder"
        return True, f"{where.run_dir}/{TOKEN_FILE} read"
    if slurm_job:
        rec = read_json(os.path.join(where.adir, "attempt.json"))
        if not isinstance(rec, dict):
            return False, (f"{where.adir}/attempt.json (the controller's) is not readable "
                           "here: the run directory is not the shared one")  # fmt: skip
        if str(rec.get("job_id")) != slurm_job or rec.get("attempt") != where.attempt:
            return False, (f"{where.adir}/attempt.json names job {rec.get('job_id')} attempt "
                           f"{rec.get('attempt')}, not {slurm_job} attempt {where.attempt}: "
                           "another run directory is mounted at this path")  # fmt: skip
        return True, f"attempt.json of job {slurm_job} read"
    if not os.path.isdir(where.adir) or not os.access(where.adir, os.W_OK):
        return False, f"{where.adir}: absent or not writable"
    return True, f"{where.adir} writable"


def check_gpus(want: int, timeout: float = GPU_LIST_S) -> tuple[bool, str]:
    """At least `want` GPUs listed by nvidia-smi -L, else by rocm-smi."""
    for argv, mark in ((["nvidia-smi", "-L"], "GPU "), (["rocm-smi", "--showid"], "GPU[")):
        try:
            res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 timeout=timeout, text=True, errors="replace")  # fmt: skip
        except FileNotFoundError:
            continue
        except subprocess.TimeoutExpired:
            return False, f"{argv[0]} gave no answer in {timeout:g}s"
        if res.returncode != 0:
            last = (res.stdout.strip().splitlines() or [""])[-1][:200]
            return False, f"{' '.join(argv)} failed (exit {res.returncode}): {last}"
        found = {ln.split(":")[0].strip() for ln in res.stdout.splitlines() if ln.startswith(mark)}
        if len(found) < want:
            return False, f"{len(found)} GPU(s) visible ({argv[0]}), {want} asked"
        return True, f"{len(found)} GPU(s) visible ({argv[0]}), {want} asked"
    # No tool to ask: nothing to tell (a GPU node has its vendor's tool; a rank on a node
    # without GPUs fails at its first CUDA call, and the diagnosis says so)
    return True, f"not checked: {want} GPU(s) asked, but neither nvidia-smi nor rocm-smi is on PATH"


def check_master(addr: str, port: str, wait: float = MASTER_WAIT_S) -> tuple[bool, str]:
    """MASTER_ADDR resolves and is routable from here, without a packet to it: the port,
    and the host's others, belong to the user's program. A failure is tried again for up
    to `wait` seconds: a Kubernetes headless service names the master's pod only once that
    pod runs, and the rendezvous itself would wait for it too. A healthy node pays one try."""
    if not addr or not port.isdigit():
        return False, "MASTER_ADDR or MASTER_PORT not set"
    end = time.monotonic() + wait
    while True:
        ok, said = _route(addr, port)
        if ok or time.monotonic() >= end:
            return ok, said
        time.sleep(0.5)


def _route(addr: str, port: str) -> tuple[bool, str]:
    """One try of check_master: resolve, then connect a UDP socket (the kernel picks the
    route and the source address; nothing is sent)."""
    try:
        host = addr.encode() if addr.isascii() else addr  # str: the idna codec (+0.4 MiB)
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError, OverflowError) as exc:
        return False, f"MASTER_ADDR {addr} does not resolve: {exc}"
    family, kind, proto, _, sockaddr = infos[0]
    with contextlib.closing(socket.socket(family, kind, proto)) as sock:
        try:
            sock.connect(sockaddr)
            source = sock.getsockname()[0]
        except OSError as exc:
            return False, f"MASTER_ADDR {addr} ({sockaddr[0]}): no route: {exc.strerror or exc}"
    return True, f"{addr} ({sockaddr[0]}) resolves and is routable from {source}"


def run_bounded(argv: list[str], cwd: str, env: dict[str, str],
                timeout: float) -> tuple[bytes, int | None]:  # fmt: skip
    """Run `argv` in a session of its own: the end of its output (OUTPUT_MAX) and its exit
    status, None past `timeout`. Its own exit is waited for, not the end of its output: a
    background child it leaves holds the pipe open. Once it exited (or the time is over)
    its whole process group is ended, so nothing it started outlives the check."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    out = bytearray()
    deadline = time.monotonic() + timeout
    code: int | None = None
    open_ = True
    try:
        while True:
            code = proc.poll()
            left = deadline - time.monotonic()
            if open_ and code is None and left > 0:
                select.select([fd], [], [], min(0.05, left))  # a child's exit wakes no pipe
            for _ in range(64):  # what is there now, bounded (a child may write on)
                if not open_:
                    break
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    break
                open_ = bool(chunk)
                out += chunk
                del out[:-OUTPUT_MAX]
            if code is not None or left <= 0:
                break
            if not open_:  # no output left to read: its exit is what remains
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = proc.wait(max(0.0, deadline - time.monotonic()))
                break
    finally:
        with contextlib.suppress(OSError):  # its group: the check and what it left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    return bytes(out), code


def check_user(cmd: str, where: Where, timeout: float) -> tuple[bool, str]:
    """The spec's health_check: bash in the workdir with the node's environment; its
    output (the end of it) kept in health-<node>.log."""
    log = os.path.join(where.adir, f"health-{where.node}.log")
    try:
        out, code = run_bounded(["bash", "-c", cmd], where.workdir, dict(where.env), timeout)
    except OSError as exc:
        return False, f"health_check could not start: {exc}"
    write_text(log, out.decode(errors="replace"), durable=False)
    last = next((ln.strip() for ln in reversed(out.decode(errors="replace").splitlines())
                 if ln.strip()), "")[:200]  # fmt: skip
    tail = f": {last}" if last else ""
    if code is None:
        return False, f"health_check ran past its timeout ({timeout:g}s){tail}"
    if code != 0:
        return False, f"health_check exited with code {code}{tail}"
    return True, "health_check exited with code 0"


def run_checks(where: Where, conf: Mapping[str, Any], slurm_job: str | None = None,
               token: str | None = None) -> list[Check]:  # fmt: skip
    """Every check of one node, in order (the spec's own last: it may take long)."""
    env = where.env
    ckpt = env.get("TREB_CHECKPOINT_DIR") or os.path.join(where.run_dir, "checkpoints")
    paths = {"run dir": where.run_dir, "workdir": where.workdir, "checkpoint dir": ckpt}
    checks = [
        _timed("runtime", check_runtime),
        _timed("disk", lambda: check_disk(paths)),
        _timed("shared", lambda: check_shared(where, slurm_job, token)),
    ]
    gpus = int(conf.get("gpus_per_node") or 0)
    if gpus > 0:
        checks.append(_timed("gpus", lambda: check_gpus(gpus)))
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    checks.append(_timed("master", lambda: check_master(addr, port)))
    cmd = conf.get("health_check")
    if cmd:
        timeout = float(conf.get("health_check_timeout") or 60.0)
        checks.append(_timed("user", lambda: check_user(str(cmd), where, timeout)))
    return checks


def record(where: Where, checks: list[Check], extra: Mapping[str, Any] | None = None,
           durable: bool = True) -> str | None:  # fmt: skip
    """health-<node>.json (with `extra`: Slurm's step, barrier.py); for an unhealthy node
    also its lost-<node>.json (node_unhealthy), the event and its exclusion. The failure's
    message, or None when healthy. `durable=False`: a healthy node's record is not synced
    here (an fsync just before the ranks start); the caller syncs it later (records.sync)."""
    failed = [c for c in checks if not c.ok]
    rec: dict[str, Any] = {
        "node": where.node, "host": where.host, "attempt": where.attempt,
        "healthy": not failed, "checked_at": time.time(),
        "seconds": round(sum(c.seconds for c in checks), 6),
        "checks": [c._asdict() for c in checks], **(extra or {}),
    }  # fmt: skip
    write_json(os.path.join(where.adir, f"health-{where.node}.json"), rec,
               durable=durable or bool(failed))  # fmt: skip
    if not failed:
        return None
    why = "; ".join(f"{c.name}: {c.detail}" for c in failed)
    message = f"{LABEL}: {where.host} ({why})"
    from ..job import nodeloss  # an unhealthy node's only: not on a healthy one's start

    # a lost node's one path: lost-<node>.json, the event, the exclusion (nodeloss.py)
    nodeloss.record(where.run_dir, where.attempt, where.node, where.host, message,
                    time.time(), label=LABEL)  # fmt: skip
    return message


def gate(where: Where, conf: Mapping[str, Any], slurm_job: str | None = None,
         extra: Mapping[str, Any] | None = None, durable: bool = True) -> str | None:  # fmt: skip
    """The node agent's step before its ranks: the checks and their records; None when
    the node is healthy, else why it is not (the agent then starts no rank; a healthy one
    waits for every node's verdict: barrier.py)."""
    os.makedirs(where.adir, mode=0o700, exist_ok=True)
    return record(where, run_checks(where, conf, slurm_job), extra, durable)


def wait_verdict(adir: str, node: int, attempt: int, limit: float, step: str) -> str | None:
    """A Slurm task other than its node's first (native: one task per rank): the first
    task's verdict, from its health-<node>.json of this attempt and this step (`step`,
    barrier.step_id: a record an earlier try left in the folder is not this one's);
    unhealthy when none came within `limit` seconds."""
    path = os.path.join(adir, f"health-{node}.json")
    end = time.monotonic() + limit
    while time.monotonic() < end:
        rec = read_json(path)
        if isinstance(rec, dict) and rec.get("attempt") == attempt and rec.get("step") == step:
            if rec.get("healthy"):
                return None
            lost = read_json(os.path.join(adir, f"lost-{node}.json"))
            return str((lost or {}).get("message") or f"{LABEL}: node {node}")
        time.sleep(0.02)
    return f"{LABEL}: node {node} (its health record did not come in {limit:g}s)"


def exclude_recorded(run_dir: str, adir: str, hosts: list[str]) -> list[str]:
    """An engine whose nodes' run dirs are their own (ssh without a shared folder): the
    exclusions of the unhealthy nodes whose records were fetched into `adir`, under the
    engine's names for them (`hosts`, by node index). The hosts excluded."""
    from ..job import nodeset  # the controller's, not the agents'

    out = []
    for name in sorted(os.listdir(adir)) if os.path.isdir(adir) else []:
        if not (name.startswith("lost-") and name.endswith(".json")):
            continue
        rec = read_json(os.path.join(adir, name))
        if not isinstance(rec, dict) or rec.get("label") != LABEL:
            continue
        node = rec.get("node")
        host = hosts[node] if isinstance(node, int) and 0 <= node < len(hosts) else None
        if host:
            nodeset.exclude(run_dir, host, str(rec.get("message") or LABEL))
            out.append(host)
    return out


def summary(adir: str) -> list[dict[str, Any]]:
    """The attempt's health records, by node (for `treb status`)."""
    out = []
    for name in sorted(os.listdir(adir)) if os.path.isdir(adir) else []:
        if name.startswith("health-") and name.endswith(".json"):
            rec = read_json(os.path.join(adir, name))
            if isinstance(rec, dict) and "healthy" in rec:
                out.append(rec)
    return sorted(out, key=lambda r: int(r["node"]) if isinstance(r.get("node"), int) else 0)


def slurm_gate(job: Mapping[str, Any]) -> str | None:
    """A Slurm task's checks: its node's first task (SLURM_LOCALID 0) runs them; the
    node's other tasks follow its verdict. None when healthy, else why not."""
    from ..contracts.rank_env import node_vars

    env = dict(os.environ)
    node = int(env.get("SLURM_NODEID") or 0)
    attempt = int(env.get("TREB_ATTEMPT") or 0)
    run_dir = str(job["run_dir"])
    adir = os.path.join(run_dir, f"attempt-{attempt}")
    env.update(node_vars(node, int(env.get("SLURM_NNODES") or 1)))
    env["LOCAL_WORLD_SIZE"] = str(job.get("ppn") or 1)
    host = env.get("SLURMD_NODENAME") or os.uname().nodename
    where = Where(run_dir, adir, attempt, node, host, str(job["workdir"]), env)
    if int(env.get("SLURM_LOCALID") or 0) != 0:
        limit = float(job.get("health_check_timeout") or 0) + GPU_LIST_S + 30.0
        return wait_verdict(adir, node, attempt, limit, barrier.step_id())
    return gate(where, job, env.get("SLURM_JOB_ID") or None, {"step": barrier.step_id()})


def on_demand(args: list[str]) -> int:
    """The `health DIR TOKEN` verb (`treb check --nodes N --on slurm`: one srun task per
    node): this node's checks against DIR (conf in DIR/health.json, written by treb with
    the token file), its record printed as one JSON line. Nothing is excluded: no run."""
    import json

    from ..contracts.rank_env import expand_hostlist, node_vars, slurm_master_port

    if len(args) != 2:
        sys.stderr.write("usage: health DIR TOKEN\n")
        return 2
    folder, token = args
    conf = read_json(os.path.join(folder, "health.json")) or {}
    env = dict(os.environ)
    node, nnodes = int(env.get("SLURM_NODEID") or 0), int(env.get("SLURM_NNODES") or 1)
    env.update(node_vars(node, nnodes))
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST", "")) or [os.uname().nodename]
    env.setdefault("MASTER_ADDR", hosts[0])
    env.setdefault("MASTER_PORT", str(slurm_master_port(env.get("SLURM_JOB_ID") or "0")))
    env.setdefault("TREB_CHECKPOINT_DIR", os.path.join(folder, "checkpoints"))
    host = env.get("SLURMD_NODENAME") or os.uname().nodename
    adir = os.path.join(folder, "attempt-0")
    where = Where(folder, adir, 0, node, host, str(conf.get("workdir") or folder), env)
    checks = run_checks(where, conf, token=token)
    rec = {"node": node, "host": host, "healthy": all(c.ok for c in checks),
           "seconds": round(sum(c.seconds for c in checks), 6),
           "checks": [c._asdict() for c in checks]}  # fmt: skip
    with contextlib.suppress(OSError):
        write_json(os.path.join(adir, f"health-{node}.json"), rec)
    print("treb-health " + json.dumps(rec, sort_keys=True), flush=True)
    return 0 if rec["healthy"] else 1
