"""`treb status`: one run in full: state, attempts, each process's outcome, first failure.
What the store holds is shown as text (`m`, `shown`: cli/table.py), never as markup."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from trebuchet.backends import get_backend
from trebuchet.cli.common import STATE_STYLE, clock, console, state_cell
from trebuchet.cli.progress import gpu_use, progress_lines, progress_of
from trebuchet.cli.report import (
    diagnosis_json,
    diagnosis_lines,
    goodput_json,
    goodput_lines,
    straggler_json,
    straggler_lines,
)
from trebuchet.cli.table import markup as m
from trebuchet.errors import UserError
from trebuchet.launcher import outputs
from trebuchet.runner import refresh
from trebuchet.runtime.node.health import summary
from trebuchet.runtime.watch.display_lines import shown
from trebuchet.spec.duration import human
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.states import describe_failure, describe_waiting


def main(args: argparse.Namespace) -> int:
    store = Store()
    members = store.sweep_runs(args.run) if args.run and not store.matches_run(args.run) else []
    if members:
        return sweep_status(store, members, args.json)
    rec = store.resolve(args.run)
    refresh(store, [rec])
    rec = store.get(rec.id) or rec
    if not rec.active:  # refresh read an active run's; a finished one's last points here
        from trebuchet.store.metrics import ingest

        ingest(store, rec)
    attempts = store.attempts(rec.id)
    procs = store.procs(rec.id)
    nodes = _node_outcomes(store, rec)
    run_dir = Path(rec.run_dir)
    for p in procs:
        name = f"rank-{p['rank']}.log" if p["rank"] is not None else f"node-{p['node']}.log"
        p["log"] = str(run_dir / f"attempt-{p['attempt']}" / name)
        p["log_name"] = f"attempt-{p['attempt']}/{name}"
    if args.json:
        for p in procs:
            p.pop("log_name")
        out = rec.to_json()
        out["attempts"] = attempts
        out["procs"] = procs
        if nodes is not None:
            out["nodes"] = nodes
        out["diagnosis"] = diagnosis_json(store, rec)
        out["progress"] = progress_of(rec)  # {step, total, fraction, rate, eta_s} or None
        out["gpus"] = gpu_use(rec)
        out["health"] = health_json(rec.run_dir)  # by attempt: each node's checks
        out["outputs"] = outputs.written(rec.run_dir)  # what the ranks wrote in the snapshot
        out["goodput"] = goodput_json(rec)  # where the wall time went (docs/goodput.md)
        out["stragglers"] = straggler_json(rec)  # ranks slower than their peers (the same)
        print(json.dumps(out, indent=2))
        return 0
    from rich.table import Table

    con = console()

    def say(lines: list[str]) -> None:  # what the records hold: text, never markup
        for line in lines:
            con.print(f"  {shown(line)}", markup=False, highlight=False)

    style = STATE_STYLE.get(rec.state, "")
    con.print(f"run [bold]{m(rec.id)}[/]  {m(rec.name)}  [{style}]{m(rec.state)}[/]")
    con.print(
        f"  {rec.backend}, launcher {rec.launcher}, {rec.nodes} node(s) x {rec.procs_per_node}, "
        f"attempt {rec.attempt + 1} of {rec.max_attempts}"
    )
    con.print(f"  created {clock(rec.created_at)}, ran {human(rec.duration)}")
    if rec.spec_path:
        con.print(f"  spec    {m(rec.spec_path)}")
    else:  # a command (treb run -- CMD) or fields (launch() with a dict)
        con.print(f"  spec    none given; as it ran: {m(rec.run_dir)}/spec.yaml")
    con.print(f"  run dir {m(rec.run_dir)}")
    if rec.git_commit:
        dirty = " with uncommitted changes" if rec.git_dirty else ""
        con.print(f"  code    git {rec.git_commit[:12]}{dirty}")
    say([*progress_lines(rec), *goodput_lines(rec), *straggler_lines(rec)])
    say(outputs.lines(rec.run_dir))
    if rec.active and rec.waiting:
        colour = "yellow" if rec.waiting.get("starts") else "red"
        con.print(f"  {shown(describe_waiting(rec.waiting))}", style=colour, markup=False)
    if rec.first_failure:
        con.print(f"  [red]first failure[/]: {m(describe_failure(rec.first_failure))}")
        if rec.first_failure.get("log"):
            con.print(f"    log {m(rec.first_failure.get('log'))}")
    from trebuchet.diagnose.hang import warned_lines

    say(diagnosis_lines(store, rec))
    say(warned_lines(rec.run_dir, rec.attempt))  # on_hang: warn, the run went on
    if attempts:
        con.print("attempts:")
        for a in attempts:
            why = f" ({a['reason']})" if a["reason"] else ""
            con.print(f"  {a['attempt'] + 1}  {a['state']:<10} {clock(a['started_at'])} -> "
                      f"{clock(a['ended_at'])}{why}", markup=False)  # fmt: skip
    checked = health_lines(rec.run_dir, rec.attempt)
    if checked:
        con.print(f"health checks (attempt {rec.attempt + 1}):")
        say(checked)
    if nodes:
        con.print(f"nodes (as {rec.backend} reports them):")
        table = Table(box=None, pad_edge=False, title=None)
        for col in ("ATTEMPT", "NODE", "NAME", "STATE", "EXIT", "REASON"):
            table.add_column(col, no_wrap=True)
        for n in nodes:
            exit_code = "-" if n.get("exit_code") is None else str(n["exit_code"])
            table.add_row(*map(m, (n["attempt"] + 1, n["node"], n["name"], n["state"],
                                   exit_code, n.get("reason") or "-")))  # fmt: skip
        con.print(table)
    if procs:
        table = Table(box=None, pad_edge=False, title=None)
        for col in ("ATTEMPT", "PROC", "RANK", "HOST", "PID", "EXIT", "SIGNAL", "STOPPED", "LOG"):
            table.add_column(col, no_wrap=True)
        for p in procs:  # a pid means something on its host only
            table.add_row(*map(m, (
                p["attempt"] + 1, p["label"], "-" if p["rank"] is None else p["rank"],
                shown(p.get("host") or "-"), p["pid"] or "-",
                "-" if p["exit_code"] is None else p["exit_code"],
                p["signal"] or "-", "by launcher" if p["stopped_by_launcher"] else "-",
                p.pop("log_name"),
            )))  # fmt: skip
        con.print(table)
    return 0


def health_json(run_dir: str) -> dict[str, list[dict[str, Any]]]:
    """Every attempt's health records (runtime/node/health.py writes them before each
    attempt's ranks), by attempt number from 1."""
    out: dict[str, list[dict[str, Any]]] = {}
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    for name in names:
        head, _, num = name.partition("-")
        if head == "attempt" and num.isdigit():
            recs = summary(os.path.join(run_dir, name))
            if recs:
                out[str(int(num) + 1)] = recs
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def health_lines(run_dir: str, attempt: int) -> list[str]:
    """One line per node of the attempt (from 0): healthy and how long the checks took,
    or which checks failed and why."""
    recs = summary(os.path.join(run_dir, f"attempt-{attempt}"))
    lines = []
    for r in recs:
        took = f"{float(r.get('seconds') or 0) * 1000:.0f} ms"
        head = f"node {r.get('node')} {r.get('host')}"
        if r.get("healthy"):
            lines.append(f"{head}: healthy ({took})")
            continue
        bad = [c for c in r.get("checks") or [] if isinstance(c, dict) and not c.get("ok")]
        why = "; ".join(f"{c.get('name')}: {c.get('detail')}" for c in bad)
        lines.append(f"{head}: UNHEALTHY ({why}) ({took})")
    return lines


def _node_outcomes(store: Store, rec: RunRecord) -> list[dict[str, Any]] | None:
    """Per-node outcomes where the engine reports them (Kubernetes' pods), else None."""
    if not getattr(rec, "backend_id", None):
        return None
    try:
        engine = get_backend(rec.backend)
    except UserError:  # an engine no longer installed
        return None
    return engine.node_outcomes(store, rec)


def sweep_status(store: Store, runs: list, as_json: bool) -> int:
    refresh(store, runs)
    runs = [store.get(r.id) or r for r in runs]
    if as_json:
        points = [{**r.to_json(), "params": json.loads(r.params or "{}")} for r in runs]
        out = {"sweep_id": runs[0].sweep_id, "runs": points}
        print(json.dumps(out, indent=2))
        return 0
    from trebuchet.cli.table import print_table

    states = [r.state for r in runs]
    counts = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
    print(f"sweep {runs[0].sweep_id}: {len(runs)} runs ({counts})")
    keys = sorted({k for r in runs for k in json.loads(r.params or "{}")})
    rows = [[r.id, state_cell(r), "-" if r.exit_code is None else str(r.exit_code),
             human(r.duration), *[json.loads(r.params or "{}").get(k, "-") for k in keys]]
            for r in runs]  # fmt: skip
    print_table(
        ["ID", "STATE", "EXIT", "DURATION", *keys], rows, [STATE_STYLE.get(s) for s in states]
    )
    return 0
