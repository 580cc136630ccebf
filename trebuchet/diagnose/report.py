"""Diagnosis as text (two lines for `treb run` and `treb status`, the full report for
`treb diagnose`) and the entry points the CLI calls. The text quotes the ranks' output:
each line is shown as text (runtime/watch/display_lines.py `shown`), never raw."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trebuchet.diagnose import catalog
from trebuchet.diagnose.codepaths import CodeMap
from trebuchet.diagnose.engine import Diagnosis, decide
from trebuchet.diagnose.sources import paths_case, run_case
from trebuchet.runtime.watch.display_lines import shown

EVIDENCE_MAX = 8


def diagnose_run(run: dict[str, Any], procs: list[dict[str, Any]] | None = None) -> Diagnosis:
    """A trebuchet run, from its RunRecord as a dict (RunRecord.to_json()) and its procs;
    paths into the code snapshot read as the user's files (diagnose/codepaths.py)."""
    d = decide(run_case(run, procs))
    code = CodeMap.for_run(run.get("run_dir"))
    if code:
        d.summary, d.evidence = code.text(d.summary), code.lines(d.evidence)
        d.frame = code.text(d.frame) if d.frame else d.frame
        if d.error:
            d.error.frames = code.lines(d.error.frames)
        if code.changed:
            d.notes.append(f"{', '.join(code.changed)} changed in {code.source} since the run: "
                           f"the paths above name the copy that ran, in {code.code}")  # fmt: skip
    return d


def diagnose_record(store: Any, rec: Any) -> Diagnosis:
    run = rec.to_json()
    if store is not None:
        attempts = {a["attempt"]: a for a in store.attempts(rec.id)}
        ff = rec.first_failure or {}
        a = attempts.get(ff.get("attempt", rec.attempt)) or {}
        run["reason"] = a.get("reason")
        run["attempt_started_at"], run["attempt_ended_at"] = a.get("started_at"), a.get("ended_at")
        return diagnose_run(run, store.procs(rec.id))
    return diagnose_run(run)


def diagnose_paths(paths: Sequence[str | Path]) -> Diagnosis:
    return decide(paths_case([Path(p) for p in paths]))


def cause_line(d: Diagnosis) -> str:
    """'gpu_oom on rank 2 (node 1): torch.OutOfMemoryError: CUDA out of memory...'."""
    if d.category is None:
        return d.summary
    where = ""
    if d.rank is not None:
        where = f" on rank {d.rank}" + (f" (node {d.node})" if d.node is not None else "")
    elif d.node is not None and d.category in ("time_limit", "node_failure", "cancelled", "killed"):
        where = f" on {d.node}"
    return f"{d.category}{where}: {d.summary}"


def two_lines(d: Diagnosis) -> list[str]:
    """The cause and the remedy, for the end of `treb run` and for `treb status`."""
    if d.category is None:
        return []
    return [shown(line) for line in
            [f"cause: {cause_line(d)}", f"fix:   {d.remedy}", *error_lines(d)]]  # fmt: skip


def error_lines(d: Diagnosis, label: str = "error: ", indent: str = "       ") -> list[str]:
    """The root cause's own error file (torch's @record): the exception as raised, and the
    traceback's last frames."""
    if d.error is None:
        return []
    lines = [f"{label}{d.error.message} (its error file {d.error.file})"]
    return lines + [f"{indent}at {frame}" for frame in d.error.frames]


def text(d: Diagnosis) -> str:
    out = []
    run = d.run
    if run:
        out.append(f"run {run.get('id')} ({run.get('name')}) {run.get('state') or ''}, "
                   f"attempt {int(run.get('attempt') or 0) + 1}".replace("  ", " "))  # fmt: skip
    else:
        out.append(f"logs: {d.source}")
    if d.category is None:
        out.append(d.summary or "no failure found")
        return "\n".join(shown(line, tab=True) for line in out) + "\n"
    out.append(f"cause:    {cause_line(d)}")
    out.append(f"category: {d.category} ({catalog.TITLES.get(d.category, '')})")
    out.append(f"fix:      {d.remedy}")
    if d.frame:
        out.append(f"user code: {d.frame}")
    out += error_lines(d, "raised:   ", "          ")
    if d.evidence:
        out.append("evidence" + (f" ({d.log})" if d.log else "") + ":")
        out += [f"    {line[:300]}" for line in d.evidence[:EVIDENCE_MAX]]
    roles: dict[str, list[str]] = {}
    for u in d.units:
        role = d.roles.get(id(u), "unknown")
        name = (
            str(u.rank)
            if u.rank is not None
            else (u.label or (f"node {u.node}" if u.node is not None else Path(u.log or "?").name))
        )
        detail = ""
        if u.failed:
            detail = f" ({catalog.exit_meaning(u.exit_code, u.signal).split(':')[0]})"
        roles.setdefault(role, []).append(name + detail)
    if roles:
        out.append("ranks:")
        for role in ("root_cause", "missing", "failed", "stopped", "running", "ok", "unknown"):
            names = roles.get(role)
            if names:
                listed = ", ".join(names[:16]) + (f" and {len(names) - 16} more" if len(names) > 16
                                                 else "")  # fmt: skip
                out.append(f"    {role:<11} {listed}")
    out += [f"note: {n}" for n in d.notes]
    return "\n".join(shown(line, tab=True) for line in out) + "\n"  # log text: never raw
