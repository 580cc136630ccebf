"""`treb fault RUN kill-node NODE | hang-rank RANK | preempt`: a fault injected into a
running run, to see the recovery work where it is used (what submitit's `_interrupt` and
Megatron Bridge's `simulate_fault` give their users). Recorded as a `fault` event in the
run's events.jsonl before it is injected. The signals are sent on the node itself by the
runtime's `fault` verb (runtime/node/fault.py): locally here, over ssh on the host, on Slurm in
an `srun --overlap --jobid J -w NODE` step of the job.

Exit 0 when the fault was injected, 1 when nothing was there to hit (the rank not
running, no process of the run on that node), 2 on bad input (a run that is not
running, an engine without faults, a node or rank the run does not have).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from trebuchet.errors import UserError
from trebuchet.runtime.node import fault
from trebuchet.runtime.rundir.records import read_json
from trebuchet.store.files import append_event, read_events

ENGINES = ("local", "ssh", "slurm")
STEP_TIMEOUT_S = 120.0


def _nodes_of(rec: Any) -> list[str]:
    """The run's nodes as its engine names them now (its latest attempt's), node 0 first."""
    run_dir = Path(rec.run_dir)
    if rec.backend == "local":  # the latest attempt's simulated nodes (a spare in: sim_nodes)
        chosen = [e.get("hosts") for e in read_events(run_dir) if e.get("event") == "nodes"]
        hosts = chosen[-1] if chosen else None
        if isinstance(hosts, list) and hosts and all(isinstance(h, str) for h in hosts):
            return hosts
        return [f"node-{n}" for n in range(int(rec.nodes or 1))]
    if rec.backend == "ssh":
        from trebuchet.backends.ssh.script import attempt_hosts

        return attempt_hosts(_ssh_info(run_dir))
    att = _latest_attempt_record(run_dir)
    nodelist = str(att.get("nodes") or "")
    if not nodelist:
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30)  # fmt: skip
    return out.stdout.split()


def _ssh_info(run_dir: Path) -> dict[str, Any]:
    """The run's ssh.json (its hosts, remote folder, runtime, ssh argv); UserError when it
    is unreadable or incomplete (a rank can reach the run directory)."""
    info = read_json(str(run_dir / "ssh.json"))
    texts = lambda v: isinstance(v, list) and all(isinstance(w, str) for w in v)  # noqa: E731
    if not (isinstance(info, dict) and texts(info.get("hosts")) and texts(info.get("ssh"))
            and isinstance(info.get("remote_run_dir"), str)
            and isinstance(info.get("runtime"), str)):  # fmt: skip
        raise UserError(f"{run_dir / 'ssh.json'}: unreadable or incomplete (the run's ssh facts)")
    return info


def _attempt_file(run_dir: Path, name: str) -> dict[str, Any]:
    """`name` in the run's latest attempt folder; {} when absent or no JSON object."""
    adir = fault.latest_attempt(str(run_dir))
    data = read_json(os.path.join(adir, name)) if adir else None
    return data if isinstance(data, dict) else {}


def _latest_attempt_record(run_dir: Path) -> dict[str, Any]:
    return _attempt_file(run_dir, "attempt.json")


def _node(nodes: list[str], word: str) -> tuple[int, str]:
    """NODE as an index (0 is the master) or a name, checked against the run's nodes."""
    if word.isdigit() and int(word) < len(nodes):
        return int(word), nodes[int(word)]
    if word in nodes:
        return nodes.index(word), word
    raise UserError(f"node {word!r}: the run's nodes are {', '.join(nodes) or 'unknown'} "
                    f"(or 0..{len(nodes) - 1})")  # fmt: skip


def _runtime(run_dir: Path) -> str:
    found = sorted(run_dir.glob("treb-runtime-*.pyz"))
    if not found:
        raise UserError(f"{run_dir}: no runtime archive (treb-runtime-*.pyz)")
    return found[-1].name


def _on_host(rec: Any, host: str, words: list[str]) -> int:
    """The runtime's fault verb on an ssh host (in the run's folder there)."""
    info = _ssh_info(Path(rec.run_dir))
    remote = info["remote_run_dir"]
    cmd = f"cd {shlex.quote(remote)} && python3 -S ./{shlex.quote(info['runtime'])} fault " + \
        " ".join(shlex.quote(w) for w in words)  # fmt: skip
    res = subprocess.run([*info["ssh"], "--", host, cmd], timeout=STEP_TIMEOUT_S)
    return res.returncode


def _on_slurm_node(rec: Any, host: str, words: list[str]) -> int:
    """The runtime's fault verb in a step of the job on `host` (--overlap: beside the
    ranks' step, which holds the node's CPUs)."""
    run_dir = Path(rec.run_dir)
    runtime = str(run_dir / _runtime(run_dir))
    argv = ["srun", "--overlap", f"--jobid={rec.backend_id}", "-w", host, "-N1", "-n1",
            "--quiet", "python3", "-S", runtime, "fault", *words]  # fmt: skip
    return subprocess.run(argv, timeout=STEP_TIMEOUT_S).returncode


def main(args: argparse.Namespace) -> int:
    from trebuchet.store.db import Store

    store = Store()
    rec = store.resolve(args.run)
    if rec.backend not in ENGINES:
        raise UserError(f"treb fault: not on {rec.backend} (only {', '.join(ENGINES)})")
    if rec.state not in ("RUNNING", "RETRYING"):
        raise UserError(f"treb fault: run {rec.id} is {rec.state}, not running")
    run_dir = Path(rec.run_dir)
    action, target = args.action, args.target
    if action in (fault.KILL_NODE, fault.HANG_RANK) and target is None:
        raise UserError(
            f"treb fault {action}: say which {'node' if action == fault.KILL_NODE else 'rank'}"
        )
    if action == fault.PREEMPT and target is not None:
        raise UserError("treb fault preempt: takes no NODE or RANK")
    world = int(rec.nodes or 1) * int(rec.procs_per_node or 1)
    node = host = None
    if action == fault.KILL_NODE:
        node, host = _node(_nodes_of(rec), str(target))
    elif action == fault.HANG_RANK and not (str(target).isdigit() and int(target) < world):
        raise UserError(f"rank {target!r}: the run has ranks 0..{world - 1}")
    att = fault.latest_attempt(str(run_dir))
    attempt = int(Path(att).name.split("-")[1]) if att else 0
    append_event(run_dir, "fault", fault=action, node=node, host=host, attempt=attempt,
                 rank=int(target) if action == fault.HANG_RANK else None,
                 by="treb fault")  # fmt: skip
    code = _inject(rec, action, target, node, host)
    print(f"treb fault: {action}{f' {target}' if target is not None else ''} on run {rec.id} "
          f"({rec.backend}): {'injected' if code == 0 else 'nothing was hit'}")  # fmt: skip
    return 0 if code == 0 else 1


def _inject(rec: Any, action: str, target: str | None, node: int | None,
            host: str | None) -> int:  # fmt: skip
    """The fault on its engine; the runtime verb's exit status (0: something was hit)."""
    run_dir, rid = str(rec.run_dir), rec.id
    if rec.backend == "local":
        if action == fault.KILL_NODE:
            return 0 if fault.kill_node(rid, node) else 1
        if action == fault.HANG_RANK:
            return 0 if fault.hang_rank(run_dir, rid, int(str(target))) else 1
        return 0 if fault.preempt(run_dir, rid) else 1
    if rec.backend == "slurm":
        if action == fault.PREEMPT:  # Slurm's own: the job goes back to the queue
            res = subprocess.run(["scontrol", "requeue", str(rec.backend_id)], timeout=60)
            return res.returncode
        if action == fault.KILL_NODE:
            assert host is not None
            return _on_slurm_node(rec, host, [fault.KILL_NODE, rid, "--job", str(rec.backend_id)])
        rank_rec = _rank_record(Path(run_dir), int(str(target)))
        if not rank_rec.get("host"):
            return 1
        return _on_slurm_node(rec, str(rank_rec["host"]),
                              [fault.HANG_RANK, run_dir, rid, str(target)])  # fmt: skip
    # ssh: on the host (the remote run folder is the runtime's cwd there)
    if action == fault.KILL_NODE:
        assert host is not None
        return _on_host(rec, host, [fault.KILL_NODE, rid, str(node)])
    hosts = _nodes_of(rec)
    if action == fault.HANG_RANK:
        on = hosts[int(str(target)) // int(rec.procs_per_node or 1)]
        return _on_host(rec, on, [fault.HANG_RANK, ".", rid, str(target)])
    codes = [_on_host(rec, h, [fault.PREEMPT, ".", rid]) for h in hosts]
    return 0 if 0 in codes else 1


def _rank_record(run_dir: Path, rank: int) -> dict[str, Any]:
    return _attempt_file(run_dir, f"rank-{rank}.json")
