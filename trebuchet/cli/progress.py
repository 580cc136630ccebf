"""A run's progress, ETA and GPU use as the verbs and the dashboard show them, from the
node agents' records (runtime/watch/eta.py, gpu.py). Where the agents keep their records on
their nodes (ssh, SkyPilot, Kubernetes: only the logs come back), the progress is read
from the tail of the first rank's log with the same parser."""

from __future__ import annotations

import os
from typing import Any

from trebuchet.runtime.watch import eta, gpu
from trebuchet.runtime.watch.metric_reader import read_config
from trebuchet.store.db import RunRecord

KEYS = ("step", "total", "fraction", "rate", "eta_s", "stalled_s")


def progress_of(rec: RunRecord) -> dict[str, Any] | None:
    """{step, total, fraction, rate, eta_s, stalled_s} of the run's current attempt, or None.
    The ETA counts down from the reading, and is none once the run stalled (stalled_s: the
    seconds since its last step); an ended run has neither."""
    adir = os.path.join(rec.run_dir, f"attempt-{rec.attempt}")
    found = eta.read(rec.run_dir, rec.attempt)
    if found is None:
        pattern = (read_config(adir) or {}).get("progress")
        for name in eta.FIRST:
            found = eta.from_log_tail(os.path.join(adir, name + ".log"),
                                      pattern if isinstance(pattern, str) else None)  # fmt: skip
            if found is not None:
                break
    if found is None:
        return None
    out = {k: found.get(k) for k in KEYS}
    if not rec.active:
        out["eta_s"] = out["stalled_s"] = None
    return out


def short(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 100:
        return f"{s}s"
    if s < 6000:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(p: dict[str, Any] | None) -> str:
    """`45% 450/1000` (or `450` without a total); `-` when unknown."""
    if not p or p.get("step") is None:
        return "-"
    step = _num(p["step"])
    if p.get("fraction") is None or not p.get("total"):
        return step
    return f"{p['fraction'] * 100:.0f}% {step}/{_num(p['total'])}"


def eta_text(p: dict[str, Any] | None) -> str:
    """`12m05s`; `stalled 45s` when no step came for a while; `-` when unknown."""
    if p and p.get("stalled_s") is not None:
        return f"stalled {short(float(p['stalled_s']))}"
    if not p or p.get("eta_s") is None:
        return "-"
    return short(float(p["eta_s"]))


def _num(v: Any) -> str:
    f = float(v)
    return str(int(f)) if f.is_integer() else f"{f:.3g}"


def gpu_use(rec: RunRecord) -> list[dict[str, Any]]:
    """The latest sample of each GPU of the current attempt: {node, index, util, mem,
    mem_total}, by node and index; a node that cannot sample: {node, error}."""
    out: list[dict[str, Any]] = []
    adir = os.path.join(rec.run_dir, f"attempt-{rec.attempt}")
    for state in gpu.read_states(adir):
        node = state.get("node")
        samples = state.get("samples") or []
        if not samples and state.get("error"):
            out.append({"node": node, "error": str(state["error"])})
        for s in samples:
            if isinstance(s, dict):
                out.append({"node": node, **{k: s.get(k) for k in
                                            ("index", "util", "mem", "mem_total")}})  # fmt: skip
    return out


def gpu_text(rows: list[dict[str, Any]]) -> str:
    """`n0:g0 87% 40.1/80 GiB, n0:g1 0% 0.5/80 GiB` (the latest sample of each GPU)."""
    parts = []
    for r in rows:
        if "error" in r:
            parts.append(f"n{r['node']}: {r['error']}")
            continue
        util = "?" if r.get("util") is None else f"{r['util']:.0f}%"
        mem = ""
        if r.get("mem") is not None:
            total = f"/{r['mem_total'] / 1024:.0f}" if r.get("mem_total") else ""
            mem = f" {r['mem'] / 1024:.1f}{total} GiB"
        parts.append(f"n{r['node']}:g{r['index']} {util}{mem}")
    return ", ".join(parts)


def progress_lines(rec: RunRecord) -> list[str]:
    """`treb status`'s lines: the progress with its rate and ETA, the GPUs' latest use."""
    out = []
    p = progress_of(rec)
    if p is not None and p.get("step") is not None:
        text = f"progress {progress_text(p)}"
        if p.get("rate"):
            text += f", {float(p['rate']):.3g} steps/s"
        if p.get("stalled_s") is not None:
            text += f", stalled: no step for {short(float(p['stalled_s']))}"
        elif p.get("eta_s") is not None:
            text += f", ETA {short(float(p['eta_s']))}"
        out.append(text)
    gpus = gpu_use(rec)
    if gpus:
        out.append(f"GPUs    {gpu_text(gpus)}")
    return out
