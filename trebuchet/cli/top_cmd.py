"""`treb top`: the active runs, refreshed in place: their latest metrics with their rate,
and how long ago each rank last wrote (runtime/watch/activity.py). On a terminal, rich on
the alternate screen (SSH, tmux) with stdin in cbreak mode only for that time; otherwise
one plain snapshot."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from trebuchet.runtime.watch.display_lines import shown
from trebuchet.store.db import RunRecord, Store

RECENT_S = 600  # --all: runs that ended this recently
RATE_WINDOW_S = 60.0
SHOWN_METRICS = 4


@dataclass
class RunView:
    rec: RunRecord
    metrics: list[tuple[str, float, float, float | None]] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # one line per node
    progress: dict[str, Any] | None = None  # cli/progress.py: step, total, fraction, eta_s
    gpus: str = ""  # the latest sample of each GPU (cli/progress.py)
    stragglers: list[str] = field(default_factory=list)  # cli/report.py: one line each


def main(args: argparse.Namespace) -> int:
    store = Store()
    if args.once or not sys.stdout.isatty():
        print("\n".join(plain(snapshot(store, args.all))))
        return 0
    return live(store, args)


def snapshot(store: Store, include_recent: bool = False) -> list[RunView]:
    """The runs to show, refreshed (engines' states, new metrics), with their details."""
    from trebuchet.runner import refresh
    from trebuchet.store.metrics import ingest

    runs = store.list(active_only=True)
    refresh(store, runs)  # also ingests the active runs' new metrics
    if include_recent:
        seen = {r.id for r in runs}
        cutoff = time.time() - RECENT_S
        runs += [r for r in store.list(limit=50) if r.id not in seen and (r.ended_at or 0) > cutoff]
    out = []
    for rec in runs:
        rec = store.get(rec.id) or rec
        if not rec.active:
            ingest(store, rec)
        from trebuchet.cli.progress import gpu_text, gpu_use, progress_of
        from trebuchet.cli.report import straggler_lines

        out.append(RunView(rec, latest_metrics(store, rec), node_lines(store, rec),
                           progress_of(rec), gpu_text(gpu_use(rec)),
                           straggler_lines(rec)))  # fmt: skip
    return out


def latest_metrics(store: Store, rec: RunRecord) -> list[tuple[str, float, float, float | None]]:
    """(name, value, step, steps a second or None) of the run's most recent metrics."""
    from trebuchet.store.metrics import latest

    last = {n: p for n, p in latest(store, rec.id).items() if not n.startswith("gpu.")}
    names = sorted(last, key=lambda n: -(last[n]["time"] or 0))[:SHOWN_METRICS]
    out = []
    for name in sorted(names):
        p = last[name]
        row = store.conn.execute(
            "SELECT step, time FROM metrics WHERE run_id = ? AND name = ? AND rank = ? "
            "AND time >= ? ORDER BY seq LIMIT 1",
            (rec.id, name, p["rank"], p["time"] - RATE_WINDOW_S),
        ).fetchone()
        rate = None
        if row and p["time"] > row[1] and p["step"] > row[0]:
            rate = (p["step"] - row[0]) / (p["time"] - row[1])
        out.append((name, p["value"], p["step"], rate))
    return out


def node_lines(store: Store, rec: RunRecord) -> list[str]:
    """Per node: `node 0: 0 running (output 2s ago), 1 exit 1` (rank, state, and for a
    running one how long ago it last wrote)."""
    procs = [p for p in store.procs(rec.id, rec.attempt) if p["label"]]
    if not procs:
        return []
    adir = os.path.join(rec.run_dir, f"attempt-{rec.attempt}")
    now = time.time()
    by_node: dict[int, list[str]] = {}
    for p in procs:
        name = f"rank-{p['rank']}" if p["rank"] is not None else f"node-{p['node']}"
        if p["exit_code"] is not None or p["signal"]:
            state = f"signal {p['signal']}" if p["signal"] else f"exit {p['exit_code']}"
        elif p["ended_at"]:
            state = "ended"
        else:
            state = "running"
            with contextlib.suppress(OSError):
                quiet = now - os.stat(os.path.join(adir, "progress", name)).st_mtime
                state += f" (output {short_age(quiet)} ago)"
        who = str(p["rank"]) if p["rank"] is not None else p["label"]
        by_node.setdefault(p["node"], []).append(f"{who} {state}")
    return [f"node {n}: " + ", ".join(parts) for n, parts in sorted(by_node.items())]


def progress_cell(p: dict[str, Any] | None) -> str:
    """`45% 450/1000, ETA 12s`, or `, stalled 45s` (cli/progress.py's texts)."""
    from trebuchet.cli.progress import eta_text, progress_text

    text, eta = progress_text(p), eta_text(p)
    if eta == "-":
        return text
    return f"{text}, {eta}" if eta.startswith("stalled") else f"{text}, ETA {eta}"


def short_age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def metric_text(m: tuple[str, float, float, float | None]) -> str:
    from trebuchet.cli.metrics_cmd import number

    name, value, step, rate = m
    text = f"{name} {number(value)} @{number(step)}"
    return text + (f" ({rate:.3g}/s)" if rate else "")


def plain(views: list[RunView]) -> list[str]:
    if not views:
        return ["no active runs (treb ps --all lists the others)"]
    out = []
    for v in views:
        r = v.rec
        out.append(
            f"{r.id}  {r.name}  {r.backend}  {r.state}  attempt {r.attempt + 1}/{r.max_attempts}"
            f"  {r.nodes}x{r.procs_per_node}  age {short_age(time.time() - r.created_at)}"
        )
        if v.progress and v.progress.get("step") is not None:
            out.append(f"  progress: {progress_cell(v.progress)}")
        if v.metrics:
            out.append("  metrics: " + ", ".join(metric_text(m) for m in v.metrics))
        if v.gpus:
            out.append(f"  gpus: {v.gpus}")
        out += [f"  {line}" for line in v.nodes + v.stragglers]
    return [shown(line) for line in out]  # names of metrics a rank printed: as text


def table(views: list[RunView], interval: float) -> Any:
    from rich.table import Table

    from trebuchet.cli.common import STATE_STYLE
    from trebuchet.cli.table import markup

    t = Table(
        title=f"treb top: {len(views)} run(s), every {interval:g}s, q quits",
        title_justify="left",
        expand=True,
    )
    for col in ("RUN", "NAME", "STATE", "ATTEMPT", "SHAPE", "AGE", "PROGRESS / ETA",
                "METRICS / RANKS"):  # fmt: skip
        t.add_column(col, overflow="fold", ratio=3 if col.startswith("METRICS") else None)
    for v in views:
        r = v.rec
        style = STATE_STYLE.get(r.state, "")
        detail = "\n".join(markup(line) for line in [
            ", ".join(metric_text(m) for m in v.metrics) or "-", *v.nodes, *v.stragglers,
            *([f"gpus: {v.gpus}"] if v.gpus else [])])  # fmt: skip
        t.add_row(
            markup(r.id), markup(r.name), f"[{style}]{markup(r.state)}[/]",
            f"{r.attempt + 1}/{r.max_attempts}", f"{r.nodes}x{r.procs_per_node}",
            short_age(time.time() - r.created_at), markup(progress_cell(v.progress)), detail,
        )  # fmt: skip
    if not views:
        t.add_row("-", "no active runs", "", "", "", "", "", "")
    return t


def live(store: Store, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    interval = max(0.2, args.interval)
    keys = Keys()
    try:
        with Live(console=Console(), screen=True, auto_refresh=False) as view:
            while True:
                view.update(table(snapshot(store, args.all), interval), refresh=True)
                if keys.quit_within(interval):
                    return 0
    except KeyboardInterrupt:
        return 0
    finally:
        keys.restore()


class Keys:
    """stdin in cbreak mode (keys arrive at once, Ctrl+C still interrupts), restored."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else -1
        self.saved: Any = None
        if self.fd >= 0:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)

    def quit_within(self, seconds: float) -> bool:
        """Wait up to `seconds` for a key; True on q or Q."""
        if self.fd < 0:
            time.sleep(seconds)
            return False
        import select

        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return False
            data = os.read(self.fd, 64)
            if not data or b"q" in data.lower():
                return True
        return False

    def restore(self) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            self.saved = None
