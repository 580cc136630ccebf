"""One finished run -> its result rows. The number comes from the spec's results CSV
written during this run, else the ranks' `performance:` lines combined as `results.ranks`
says, else the HuggingFace Trainer's train_samples_per_second."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.results import table
from trebuchet.runtime.process.procs import hostname
from trebuchet.runtime.rundir.records import read_json
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.store.states import ACTIVE
from trebuchet.view.follow import attempt_logs

if TYPE_CHECKING:
    from trebuchet.results import parse

RANKS = ("rank0", "sum", "mean")
DEFAULT_FILE = "results.csv"


def options(spec: Any) -> tuple[str, str]:
    """(results file, rank aggregation) from the spec's `results:` block, read defensively:
    `spec` may be the Spec model (with or without a `results` field) or its YAML mapping."""
    block = spec.get("results") if isinstance(spec, dict) else getattr(spec, "results", None)
    if isinstance(block, dict):
        file, ranks = block.get("file"), block.get("ranks")
    else:
        file, ranks = getattr(block, "file", None), getattr(block, "ranks", None)
    ranks = ranks if ranks in RANKS else "rank0"
    return str(file or DEFAULT_FILE), ranks


def _read_json(path: Path) -> Any:
    return read_json(str(path))  # regular files only: a rank's FIFO never blocks


def _spec(run_dir: Path) -> dict[str, Any]:
    """The run's resolved spec: spec.json, or spec.yaml for runs recorded before it."""
    data = _read_json(run_dir / "spec.json")
    if isinstance(data, dict):
        return data
    try:
        import yaml

        data = yaml.safe_load(read_text(run_dir / "spec.yaml"))
    except Exception:  # noqa: BLE001 - unreadable, damaged (yaml.YAMLError) or no yaml: defaults
        return {}
    return data if isinstance(data, dict) else {}


def _git(workdir: str | None, created_at: float) -> str | None:
    """The workdir's commit, if it was already HEAD's commit when the run was created."""
    from trebuchet.launcher.snapshot import in_git_tree

    if not workdir or not Path(workdir).is_dir() or not in_git_tree(Path(workdir)):
        return None
    try:
        out = subprocess.run(
            ["git", "-C", workdir, "log", "-1", "--format=%H %ct", f"--before={int(created_at)}"],
            capture_output=True, text=True, timeout=10,
        ).stdout.split()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0] if out else None


def _rank_logs(adir: Path) -> dict[int, Path]:
    """rank-<r>.log of the attempt; node-<n>.log (the unit under launcher none) otherwise:
    those that hold something (a silent run's end never imports the parsers)."""
    logs = attempt_logs(adir)
    kind = "rank" if any(k == "rank" for k, _, _ in logs) else "node"
    return {num: path for k, num, path in logs if k == kind and _size(path)}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def aggregate(values: dict[int, parse.Value], how: str) -> tuple[float, str, str] | None:
    """(value, metric, source) over ranks: rank 0's (or the lowest that reported), the sum
    or the mean of the ranks that report the same metric as the lowest one."""
    if not values:
        return None
    first_rank = min(values)
    metric = values[first_rank].metric
    if how == "rank0":
        rank = 0 if 0 in values else first_rank
        v = values[rank]
        return v.value, v.metric, f"rank {rank}" + ("" if rank == 0 else " (rank 0 printed none)")
    same = {r: v.value for r, v in values.items() if v.metric == metric}
    total = sum(same.values())
    value = total if how == "sum" else total / len(same)
    return value, metric, f"{how} of {len(same)} rank(s)"


def _csv_path(name: str, run_dir: Path, cwd: str | None, started: float | None) -> Path | None:
    """The results CSV of this run: in the run dir, else where the ranks ran (not stale)."""
    candidates = [run_dir / name]
    if cwd:
        candidates.append(Path(cwd) / name)
    for p in candidates:
        if not p.is_file():
            continue
        inside = run_dir in p.resolve().parents
        if inside or started is None or p.stat().st_mtime >= started - 1:
            return p
    return None


def _environment(spec: dict[str, Any], local: dict[str, Any]) -> tuple[str, str | None]:
    env = local.get("environment") or {}
    block = spec.get("environment") or {}
    if block.get("bare_nodes_only") and not env:  # not built here: the submitting env ran it
        block = {}
    image = env.get("image") or block.get("image")
    if image:
        return str(image), str(image)
    kind = env.get("kind") or ("conda" if block.get("conda") else "venv" if block else None)
    if not kind:
        return "current", None
    return f"{kind}:{env.get('name') or block.get('name') or '-'}", None


def _durations(store: Any, rec: Any, run_dir: Path) -> tuple[float | None, float | None]:
    events = [json.loads(x) for x in _lines(run_dir / "events.jsonl")]
    build = next((float(ev["seconds"]) for ev in reversed(events)
                  if ev.get("event") == "environment_ready" and ev.get("seconds") is not None),
                 None)  # fmt: skip
    attempt = next((a for a in store.attempts(rec.id) if a["attempt"] == rec.attempt), None)
    test = None
    if attempt and attempt.get("started_at") and attempt.get("ended_at"):
        test = attempt["ended_at"] - attempt["started_at"]
    elif rec.started_at and rec.ended_at:
        test = rec.ended_at - rec.started_at
    return build, test


def _lines(path: Path) -> list[str]:
    try:
        return [ln for ln in read_text(path).splitlines() if ln.strip().startswith("{")]
    except OSError:
        return []


def compute(store: Any, rec: Any) -> list[dict[str, Any]]:
    """The rows of one finished run (not stored)."""
    run_dir = Path(rec.run_dir)
    spec = _spec(run_dir)
    job = _read_json(run_dir / "job.json")
    local = job.get("plan") if isinstance(job, dict) else None  # launcher/plan.py
    local = local if isinstance(local, dict) else {}
    file, how = options(spec)
    adir = run_dir / f"attempt-{rec.attempt}"
    cwd = next((p.get("cwd") for p in local.get("procs", []) if p.get("cwd")), spec.get("workdir"))
    environment, image = _environment(spec, local)
    build, test = _durations(store, rec, run_dir)
    gpn = spec.get("gpus_per_node")
    gpn = gpn if isinstance(gpn, int) else None
    command = spec.get("command")
    commit = getattr(rec, "git_commit", None) or _git(spec.get("workdir"), rec.created_at)
    base: dict[str, Any] = {
        "run_id": rec.id, "workload": rec.name, "backend": rec.backend, "launcher": rec.launcher,
        "nnodes": rec.nodes, "procs_per_node": rec.procs_per_node, "gpus_per_node": gpn,
        "n_gpus": rec.nodes * gpn if gpn is not None and gpn >= 0 else None,
        "environment": environment,
        "docker_image": image, "git_commit": commit, "git_dirty": getattr(rec, "git_dirty", None),
        "machine_name": rec.host or hostname(), "build_duration": build,
        "test_duration": test, "aggregation": how, "run_state": rec.state,
        "created_at": rec.created_at,
        "args": shlex.join(command) if isinstance(command, list) else command,
    }  # fmt: skip
    rows: list[dict[str, Any]] = []
    path = _csv_path(file, run_dir, cwd, rec.started_at)
    if path is not None:
        from trebuchet.results import parse

        try:
            for r in parse.results_csv(path):
                rows.append({**base, "model": f"{rec.name}_{r.model}", "performance": r.value,
                             "metric": r.metric, "source": str(path), "extra": r.extra,
                             "status": table.status(rec.state, r.value)})  # fmt: skip
        except (OSError, ValueError) as exc:  # a malformed CSV: say so in the row
            base["extra"] = {"results_error": str(exc)}
    if rows:
        return rows
    logs = _rank_logs(adir)
    found = _from_logs(logs, how) if logs else None
    value, metric, source = found if found else (None, None, None)
    return [{**base, "model": rec.name, "performance": value, "metric": metric, "source": source,
             "status": table.status(rec.state, value)}]  # fmt: skip


def _from_logs(logs: dict[int, Path], how: str) -> tuple[float, str, str] | None:
    """The ranks' `performance:` lines, else the HF Trainer's train_samples_per_second."""
    from trebuchet.results import parse

    values = {r: v for r, p in logs.items() if (v := parse.performance(p))}
    found = aggregate(values, how)
    if found is None:
        values = {r: v for r, p in logs.items() if (v := parse.hf_samples_per_second(p))}
        found = aggregate(values, how)
        if found:
            found = (found[0], found[1], found[2] + ", train_samples_per_second")
    return found


def collect(store: Any, rec: Any, force: bool = False) -> list[dict[str, Any]]:
    """The run's rows: stored ones, or computed now and stored (finished runs only)."""
    table.ensure(store.conn)
    if rec.state in ACTIVE:
        return []
    if not force:
        rows = table.load(store.conn, rec.id)
        if rows:
            return rows
    rows = compute(store, rec)
    table.save(store, rec.id, rows)
    try:
        from trebuchet.store.files import write_json

        # a copy of the table's rows, computed again from the logs if lost: not synced
        # (an fsync on the attached run's way to its summary)
        write_json(Path(rec.run_dir) / "results.json", rows, durable=False)
    except OSError:
        pass  # a read-only or vanished run dir: the table still has them
    return table.load(store.conn, rec.id)
