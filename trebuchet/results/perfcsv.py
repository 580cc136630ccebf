"""Result rows as madengine's perf.csv, and the relative change between runs.

madengine's columns come first, in its order, filled where trebuchet has the same fact
(the engine fills its own: Backend.perf_fields), so its dashboards read the file; then
trebuchet's own columns and the workload's results CSV's extra ones. relative_change is a
plain percentage against the previous successful row of the same model, metric and shape
among the rows shown: what a CSV reader can plot (madengine's database keeps a dict).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

MADENGINE = [
    "model", "n_gpus", "nnodes", "gpus_per_node", "training_precision", "pipeline", "args",
    "tags", "docker_file", "base_docker", "docker_sha", "docker_image", "git_commit",
    "machine_name", "deployment_type", "launcher", "gpu_architecture", "performance", "metric",
    "relative_change", "status", "build_duration", "test_duration", "dataname",
    "data_provider_type", "data_size", "data_download_duration", "build_number",
    "additional_docker_run_options",
]  # fmt: skip
OURS = ["run_id", "workload", "backend", "procs_per_node", "environment", "aggregation",
        "source", "run_state", "git_dirty", "created_at"]  # fmt: skip


def engine_fields(row: dict[str, Any]) -> dict[str, str]:
    """The columns the row's engine fills (deployment_type: its name, or madengine's);
    an engine that is not installed here: its name."""
    from trebuchet.backends import get_backend
    from trebuchet.errors import UserError

    name = str(row.get("backend") or "")
    try:
        return get_backend(name).perf_fields(row) if name else {"deployment_type": ""}
    except UserError:
        return {"deployment_type": name}


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(text: str) -> str:
    """`text` as a CSV cell a spreadsheet shows as text: one starting with = + - @ (or a
    tab or CR) that is no number gets a leading `'`, else the spreadsheet runs it as a
    formula (`=HYPERLINK(...)` from a rank's metric name or results column). Numbers
    (-2, +1.5e-05) stay numbers."""
    if not text.startswith(FORMULA_START):
        return text
    try:
        float(text)
    except ValueError:
        return "'" + text
    return text


def number(v: Any) -> str:
    """A value as CSV text: integers without '.0', floats in their shortest exact form."""
    if v is None:
        return ""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)


def shape(row: dict[str, Any]) -> str:
    """`NODESxPROCS` (`2x8`), with `, G GPUs/node` when the row's run asked for GPUs."""
    text = f"{row.get('nnodes')}x{row.get('procs_per_node')}"
    gpus = row.get("gpus_per_node")
    return f"{text}, {gpus} GPUs/node" if gpus else text


def relative_changes(rows: list[dict[str, Any]]) -> list[float | None]:
    """Percent change of each row against the previous successful one of its model, metric
    and shape: a 1x2 run against a 1x1 one is no change of the code (+163.92% that was
    the second process, not the commit)."""
    last: dict[tuple[str, str, str], float] = {}
    out: list[float | None] = []
    for r in rows:
        key = (r.get("model") or "", r.get("metric") or "", shape(r))
        v = r.get("performance")
        base = last.get(key)
        out.append(None if v is None or not base else (v - base) / abs(base) * 100.0)
        if v is not None and r.get("status") == "SUCCESS":
            last[key] = v
    return out


def perf_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, str]]]:
    """(header, CSV rows) in madengine's column order, then ours, then CSV extras."""
    changes = relative_changes(rows)
    extras: list[str] = []
    for r in rows:
        for k in r.get("extra") or {}:
            if k not in extras and k not in MADENGINE and k not in OURS:
                extras.append(k)
    header = MADENGINE + OURS + extras
    out = []
    for r, change in zip(rows, changes, strict=True):
        row = {k: number(r[k]) if k in r and k != "extra" else "" for k in header}
        row.update(engine_fields(r))
        for k in ("build_duration", "test_duration"):
            if r.get(k) is not None:
                row[k] = f"{r[k]:.3f}"
        if r.get("created_at"):
            row["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["created_at"]))
        row["relative_change"] = "" if change is None else f"{change:.2f}"
        for k, v in (r.get("extra") or {}).items():
            if k in row:
                row[k] = v if isinstance(v, str) else json.dumps(v)
        out.append(row)
    return header, out


def write(rows: list[dict[str, Any]], path: Path) -> int:
    header, out = perf_rows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)  # every text cell, column names included, neutral (cell())
        w.writerow([cell(k) for k in header])
        w.writerows([cell(v) if isinstance(v, str) else v for v in (r[k] for k in header)]
                    for r in out)  # fmt: skip
    return len(out)
