"""The dashboard's pages as HTML strings, from the store and the run directories.

Each function takes an open Store and plain values and returns the page's body; the
routes (app.py) open the store, catch errors and send the page. Everything rendered goes
through html.e(); the charts' numbers travel as JSON (html.data) for static/app.js.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trebuchet.results.parse import finite
from trebuchet.store.db import RunFilter, RunRecord, Store
from trebuchet.store.states import ACTIVE, TERMINAL, describe_failure
from trebuchet.ui.html import data, e, state, table, url, when

PAGE_SIZE = 100
SPEC_MAX = 256 * 1024
SORTS = ("created", "name", "state", "backend", "duration")


def _duration(rec: RunRecord) -> str:
    from trebuchet.spec.duration import human

    return human(rec.duration)


def _run_link(rec: RunRecord) -> str:
    return f'<a class="run" href="{url("/runs/" + rec.id)}">{e(rec.id)}</a>'


def _sweep_link(sweep_id: str | None) -> str:
    return f'<a href="{url("/sweeps/" + sweep_id)}">{e(sweep_id)}</a>' if sweep_id else ""


def _options(
    values: list[Any], chosen: Any, label: Callable[[Any], str] = str,
    value: Callable[[Any], str] = str,
) -> str:  # fmt: skip
    return "".join(f'<option value="{e(value(v))}"{" selected" if v == chosen else ""}>'
                   f"{e(label(v))}</option>" for v in values)  # fmt: skip


# -- runs ------------------------------------------------------------------------------------
def runs_filter(q: dict[str, str], store: Store) -> RunFilter:
    """The runs page's query -> RunFilter; bad values raise UserError (shown on the page)."""
    from trebuchet.cli.filters import parse_states, parse_when

    name = q.get("name") or None
    if name and not any(c in name for c in "*?["):
        name = f"*{name}*"  # a plain word matches inside names
    where = RunFilter(
        states=parse_states([q["state"]], "state") if q.get("state") else (),
        name=name,
        backend=q.get("backend") or None,
        since=parse_when(q["since"], "since") if q.get("since") else None,
    )
    if q.get("sweep"):
        members = store.sweep_runs(q["sweep"])
        where.sweep_id = members[0].sweep_id if members else q["sweep"]
    return where


def runs_page(store: Store, q: dict[str, str]) -> str:
    from trebuchet.runner import refresh

    where = runs_filter(q, store)
    asked = q.get("sort")
    sort = asked if asked in SORTS else "created"
    desc = q.get("desc", "1") != "0"
    try:
        page = max(0, int(q.get("page") or 0))
    except ValueError:
        page = 0
    rows, total = store.page(where, sort, desc, page * PAGE_SIZE, PAGE_SIZE)
    if any(r.active for r in rows):  # the engines' word on the active runs shown
        refresh(store, [r for r in rows if r.active])
        rows = [store.get(r.id) or r for r in rows]
    backends = [r[0] for r in store.conn.execute("SELECT DISTINCT backend FROM runs")]
    keep = {k: q.get(k) for k in ("state", "name", "backend", "sweep", "since")}

    def head(key: str, label: str) -> str:
        flip = "0" if key == sort and desc else "1"
        mark = (" ▼" if desc else " ▲") if key == sort else ""
        return f'<a href="{url("/", **keep, sort=key, desc=flip)}">{e(label)}{mark}</a>'

    states = ["", "active", "ended", *sorted(ACTIVE | TERMINAL)]
    options = _options(states, q.get("state") or "", lambda s: s or "any state")
    boptions = _options(["", *sorted(backends)], q.get("backend") or "",
                        lambda b: b or "any engine")  # fmt: skip
    form = (
        '<form class="filters" method="get" action="/">'
        f'<select name="state" id="f-state">{options}</select>'
        f'<input name="name" id="f-name" placeholder="name or glob" value="{e(q.get("name"))}">'
        f'<select name="backend" id="f-backend">{boptions}</select>'
        f'<input name="sweep" id="f-sweep" placeholder="sweep id" value="{e(q.get("sweep"))}">'
        f'<input name="since" id="f-since" placeholder="since: 2h, 2024-05-01" '
        f'value="{e(q.get("since"))}">'
        f'<input type="hidden" name="sort" value="{e(sort)}">'
        f'<input type="hidden" name="desc" value="{"1" if desc else "0"}">'
        '<button type="submit" id="f-apply">filter</button></form>'
    )
    body = [
        f"<td>{_run_link(r)}</td><td class='name'>{e(r.name)}</td><td>{state(r.state)}</td>"
        f"<td>{e(r.backend)}</td><td>{r.nodes}x{r.procs_per_node}</td>"
        f"<td>{r.attempt + 1}/{r.max_attempts}</td><td>{when(r.created_at)}</td>"
        f"<td>{e(_duration(r))}</td><td>{_sweep_link(r.sweep_id)}</td>"
        f"<td>{e((r.git_commit or '')[:10])}</td>"
        f"<td class='progress'>{_progress(r) if r.active else '-'}</td>"
        for r in rows
    ]
    heads = [head("created", "id"), head("name", "name"), head("state", "state"),
             head("backend", "engine"), "shape", "attempt", head("created", "created"),
             head("duration", "duration"), "sweep", "commit", "progress"]  # fmt: skip
    thead = "".join(f"<th>{h}</th>" for h in heads)
    tbody = "".join(f'<tr data-run="{e(r.id)}">{b}</tr>' for r, b in zip(rows, body, strict=True))
    pages = (total + PAGE_SIZE - 1) // PAGE_SIZE
    nav = []
    if page > 0:
        nav.append(f'<a href="{url("/", **keep, sort=sort, desc=int(desc), page=page - 1)}">'
                   "&larr; newer</a>")  # fmt: skip
    if page + 1 < pages:
        older = url("/", **keep, sort=sort, desc=int(desc), page=page + 1)
        nav.append(f'<a id="next" href="{older}">older &rarr;</a>')
    first = page * PAGE_SIZE + 1 if rows else 0
    last = page * PAGE_SIZE + len(rows)
    count = f'<p class="count" id="count">{first}-{last} of {total} runs</p>'
    return (
        f"<h1>Runs</h1>{form}{count}"
        f'<table id="runs"><thead><tr>{thead}</tr></thead><tbody>{tbody}</tbody></table>'
        f'<p class="pager">{" ".join(nav)}</p>'
    )


# -- one run ---------------------------------------------------------------------------------
def _timeline(
    rec: RunRecord, attempts: list[dict], procs: list[dict], stuck: tuple[int, int] | None = None
) -> str:
    """Each attempt as rows of bars, one per rank: from the attempt's start to the rank's
    end (or now), coloured by how it ended; the first failure is marked, and a hang's
    stuck rank (`stuck`: attempt, rank)."""
    now = time.time()
    ff = rec.first_failure or {}
    parts = []
    for a in attempts or [{"attempt": rec.attempt, "state": rec.state, "started_at": None,
                           "ended_at": None, "reason": None}]:  # fmt: skip
        n = a["attempt"]
        start = a.get("started_at") or rec.started_at or rec.created_at
        end = a.get("ended_at") or (rec.ended_at if rec.state in TERMINAL else None) or now
        span = max(end - start, 1e-6)
        why = f" ({e(a['reason'])})" if a.get("reason") else ""
        rows = []
        for p in (p for p in procs if p["attempt"] == n):
            stop = p.get("ended_at") or (end if a.get("ended_at") else now)
            width = max(1.0, min(100.0, 100.0 * (stop - start) / span))
            if p.get("exit_code") is None and not p.get("signal") and not p.get("ended_at"):
                kind = "live" if not a.get("ended_at") else "off"
            elif p.get("stopped_by_launcher"):
                kind = "off"
            elif p.get("exit_code") == 0:
                kind = "ok"
            else:
                kind = "bad"
            first = ff.get("attempt") == n and ff.get("label") == p["label"]
            hung = stuck is not None and stuck == (n, p.get("rank"))
            outcome = (f"signal {p['signal']}" if p.get("signal")
                       else "running" if p.get("exit_code") is None
                       else f"exit {p['exit_code']}")  # fmt: skip
            if p.get("stopped_by_launcher"):
                outcome += ", stopped by the launcher"
            rank = "-" if p.get("rank") is None else p["rank"]
            marks = " first" * first + " stuck" * hung
            note = " ← first failure" * first + " ← stuck (hang)" * hung
            rows.append(
                f'<div class="tl-row{marks}" data-label="{e(p["label"])}">'
                f'<span class="tl-label">{e(p["label"])} (rank {e(rank)}, node {e(p["node"])})'
                f'</span><span class="tl-track"><span class="tl-bar {kind}" '
                f'style="width:{width:.1f}%" title="{e(outcome)}"></span></span>'
                f'<span class="tl-out">{e(outcome)}{note}</span></div>'
            )
        parts.append(
            f'<div class="attempt" data-attempt="{n}"><h3>attempt {n + 1}: {state(a["state"])}'
            f" {when(a.get('started_at'))} &rarr; {when(a.get('ended_at'))}{why}</h3>"
            + ("".join(rows) or "<p class='muted'>no processes recorded yet</p>")
            + "</div>"
        )
    return "".join(parts)


GOODPUT_COLOURS = {"productive": "#2e7d32", "queued": "#9e9e9e", "environment": "#795548",
                   "startup": "#1976d2", "redone": "#e65100", "restart": "#f9a825",
                   "hang": "#c62828", "node_loss": "#6a1b9a", "teardown": "#607d8b",
                   "other": "#bdbdbd"}  # fmt: skip


def _goodput(rec: RunRecord) -> str:
    """A bar of where the run's wall time went (trebuchet/goodput/, docs/goodput.md), each
    cause a segment as wide as its share, and the summary line under it."""
    from trebuchet.goodput import line, of_run
    from trebuchet.goodput.account import WORDS, short

    try:
        g = of_run(rec)
    except Exception as exc:  # noqa: BLE001 - the page shows the rest
        return f"<p class='muted' id='goodput'>goodput unavailable: {e(repr(exc))}</p>"
    if g.wall_s <= 0:
        return "<p class='muted' id='goodput'>no time recorded yet</p>"
    segs = []
    for cause, colour in GOODPUT_COLOURS.items():
        v = g.seconds.get(cause, 0.0)
        if v <= 0:
            continue
        word = WORDS.get(cause, "training kept")
        tip = f"{word}: {short(v)} ({100 * v / g.wall_s:.1f} %)"
        width = f"width:{100 * v / g.wall_s:.2f}%;background:{colour}"
        segs.append(
            f'<span class="gp-seg" data-cause="{cause}" title="{e(tip)}" style="{width}"></span>'
        )
    return (
        f"<div id='goodput'><div class='gp-bar'>{''.join(segs)}</div>"
        f"<p class='gp-line'>{e(line(g))}</p></div>"
    )


def _stragglers(rec: RunRecord) -> str:
    """The ranks of the latest attempt slower than their peers (runtime/watch/straggler.py,
    docs/goodput.md), each a line; nothing when no two ranks marked steps."""
    from trebuchet.cli.report import straggler_json
    from trebuchet.runtime.watch.straggler import lines

    data = straggler_json(rec)
    if not data:
        return ""
    if "error" in data:
        return f"<p class='muted' id='stragglers'>stragglers unavailable: {e(data['error'])}</p>"
    found = lines(data) or ["no straggler: every rank keeps its peers' pace"]
    cls = "bad" if data["stragglers"] else "muted"
    body = "".join(f"<p class='{cls}'>{e(t)}</p>" for t in found)
    return f"<div id='stragglers'>{body}</div>"


def _results(store: Store, rec: RunRecord) -> str:
    if rec.state in ACTIVE:
        return "<p class='muted'>results come when the run ends</p>"
    from trebuchet.results import collect
    from trebuchet.results.perfcsv import number

    try:
        rows = collect.collect(store, rec)
    except Exception as exc:  # noqa: BLE001 - the rest of the page still shows
        return f"<p class='bad'>results unavailable: {e(exc)}</p>"
    cells = [[e(r["model"]), e(r["status"]), e(number(r.get("performance")) or "-"),
              e(r.get("metric") or "-"), e(r.get("source") or "-")] for r in rows]  # fmt: skip
    return table(["model", "status", "performance", "metric", "source"], cells, "results")


def _spec_text(run_dir: Path) -> str:
    from trebuchet.runtime.rundir.regular import read_text

    try:  # a regular file only: a rank may have put a FIFO in its place
        text = read_text(run_dir / "spec.yaml", SPEC_MAX + 1)
    except OSError:
        return "(spec.yaml is gone)"
    return text[:SPEC_MAX] + ("\n[treb: cut at 256 KiB]" if len(text) > SPEC_MAX else "")


def _progress(rec: RunRecord) -> str:
    """`45% 450/1000, ETA 12s` as `treb ps` and `treb top` say it (cli/progress.py), with
    the figures as data attributes; `-` when the run prints none."""
    from trebuchet.cli.progress import eta_text, progress_of, progress_text

    p = progress_of(rec)
    if not p or p.get("step") is None:
        return "-"
    attrs = "".join(f' data-{k.replace("_", "-")}="{e(p[k])}"' for k in p if p[k] is not None)
    eta = eta_text(p)
    text = progress_text(p) + ("" if eta == "-" else f", ETA {eta}")
    frac = p.get("fraction")
    bar = (f'<progress max="1" value="{float(frac):.4f}"></progress> ' if frac is not None
           else "")  # fmt: skip
    return f"<span class='run-progress'{attrs}>{bar}{e(text)}</span>"


def _gpus(rec: RunRecord) -> str:
    """The latest sample of each GPU of the current attempt (runtime/watch/gpu.py), a table."""
    from trebuchet.cli.progress import gpu_use

    rows = gpu_use(rec)
    if not rows:
        return ""
    body = []
    for r in rows:
        if "error" in r:
            body.append(f"<tr data-node='{e(r['node'])}'><td>{e(r['node'])}</td>"
                        f"<td colspan='3' class='bad'>{e(r['error'])}</td></tr>")  # fmt: skip
            continue
        util = "?" if r.get("util") is None else f"{float(r['util']):.0f}%"
        mem = "?" if r.get("mem") is None else f"{float(r['mem']):.0f}"
        total = "" if r.get("mem_total") is None else f" / {float(r['mem_total']):.0f}"
        body.append(f"<tr class='gpu' data-node='{e(r['node'])}' data-index='{e(r['index'])}' "
                    f"data-util='{e(r.get('util'))}'><td>{e(r['node'])}</td><td>{e(r['index'])}"
                    f"</td><td>{e(util)}</td><td>{e(mem + total)} MiB</td></tr>")  # fmt: skip
    return ("<h2>GPUs</h2><table id='gpus'><thead><tr><th>node</th><th>GPU</th>"
            f"<th>utilisation</th><th>memory</th></tr></thead><tbody>{''.join(body)}</tbody>"
            "</table>")  # fmt: skip


def series(points: dict[str, list[tuple[float, float, float]]]) -> dict[str, dict[str, list]]:
    """Store.metrics' series as the charts take them: {name: {x: steps, y: values}}."""
    return {n: {"x": [p[0] for p in pts], "y": [p[1] for p in pts]} for n, pts in points.items()}


def ingest(store: Store, rec: RunRecord) -> None:
    """The run's new metric points into the store (what `treb metrics` does first), so a
    page shows a run's metrics whether or not a command looked at it since it ended."""
    try:
        from trebuchet.store.metrics import ingest as store_ingest

        store_ingest(store, rec)
    except Exception:  # noqa: BLE001 - the page shows what the store has
        pass


STACKS_MAX = 256 * 1024


def _hang(rec: RunRecord, attempts: list[dict]) -> tuple[str, tuple[int, int] | None]:
    """The last hang of the run (hang.json of an attempt: the rule fired, stacks were
    dumped) as HTML: what `treb status` says of it, the stuck rank and every rank's
    stack, grouped as `treb stacks` groups them; and (attempt, rank) of the stuck rank."""
    from trebuchet.cli.stacks_cmd import stack_text
    from trebuchet.diagnose.hang import grouped_text, hang_lines, read

    numbers = sorted({a["attempt"] for a in attempts} | {rec.attempt}, reverse=True)
    for n in numbers:
        adir = Path(rec.run_dir) / f"attempt-{n}"
        try:
            h = read(adir)
        except Exception:  # noqa: BLE001 - a damaged record: no hang shown
            h = None
        if h is None:
            continue
        texts = {r.name: stack_text(Path(h.stacks_dir) / f"{r.name}.txt") for r in h.ranks}
        stacks = grouped_text(h.ranks, texts)
        if len(stacks) > STACKS_MAX:
            stacks = stacks[:STACKS_MAX] + "\n[treb: cut at 256 KiB]"
        lines = "".join(f"<p class='hang-line'>{e(x)}</p>" for x in hang_lines(adir))
        stuck = None
        who = ""
        if h.odd is not None:
            kind, _, num = h.odd.name.partition("-")
            why = (f"in {h.odd.what} ({h.odd.where or '?'})" if h.odd.frames
                   else "no stack: " + (h.odd.why or "none was dumped"))  # fmt: skip
            silent = f", silent for {h.odd.silent:.1f}s" if h.odd.silent is not None else ""
            who = (f"<p id='hang-rank' class='bad' data-rank='{e(num)}'>stuck: {e(h.odd.label)} "
                   f"(attempt {n + 1}), {e(why)}{e(silent)}</p>")  # fmt: skip
            if kind == "rank" and num.isdigit():
                stuck = (n, int(num))
        shown = e(stacks) or "no stacks were dumped"
        html_ = (f"<h2>Hang</h2><div id='hang' data-attempt='{n}'>{lines}{who}"
                 f"<pre id='stacks'>{shown}</pre></div>")  # fmt: skip
        return html_, stuck
    return "", None


def _log_choice(
    rec: RunRecord, choices: list[tuple[int, str]], shown: int, stuck: tuple[int, int] | None
) -> tuple[int, str] | None:
    """The log the viewer opens: the first failing rank's, else a hang's stuck rank's,
    else the first of the latest attempt."""
    ff: dict[str, Any] = dict(rec.first_failure or {})
    wanted = []
    attempt, rank, node = ff.get("attempt"), ff.get("rank"), ff.get("node")
    if attempt is not None and rank is not None:
        wanted.append((int(attempt), f"rank-{int(rank)}.log"))
    if attempt is not None and node is not None:
        wanted.append((int(attempt), f"node-{int(node)}.log"))
    if stuck is not None:
        wanted.append((stuck[0], f"rank-{stuck[1]}.log"))
    for choice in wanted:
        if choice in choices:
            return choice
    return next((c for c in choices if c[0] == shown), None)


def run_page(store: Store, rec: RunRecord, csrf: str) -> str:
    from trebuchet.cli.report import diagnosis_lines
    from trebuchet.ui.logs import log_files

    run_dir = Path(rec.run_dir)
    attempts = store.attempts(rec.id)
    procs = store.procs(rec.id)
    dirty = " with uncommitted changes" if rec.git_dirty else ""
    facts = [
        ("state", state(rec.state)),
        ("name", e(rec.name)),
        ("engine", e(rec.backend)),
        ("launcher", e(rec.launcher)),
        ("shape", f"{rec.nodes} node(s) x {rec.procs_per_node}"),
        ("attempt", f"{rec.attempt + 1} of {rec.max_attempts}"),
        ("created", when(rec.created_at)),
        ("duration", e(_duration(rec))),
        ("exit code", e("-" if rec.exit_code is None else rec.exit_code)),
        ("code", e(f"git {rec.git_commit}{dirty}") if rec.git_commit else "-"),
        ("run dir", e(rec.run_dir)),
        ("progress", _progress(rec)),
    ]
    if rec.sweep_id:
        facts.append(("sweep", _sweep_link(rec.sweep_id) + f" {e(rec.params)}"))
    dl = "".join(f"<dt>{k}</dt><dd id='fact-{k.replace(' ', '-')}'>{v}</dd>" for k, v in facts)
    buttons = [("cancel", ' class="danger"')] if rec.active else []
    actions = [
        f'<form method="post" action="{url(f"/runs/{rec.id}/{act}")}">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}">'
        f'<button id="{act}"{cls} type="submit">{act}</button></form>'
        for act, cls in [*buttons, ("rerun", "")]
    ]
    failure = ""
    if rec.first_failure:
        what = e(describe_failure(rec.first_failure))
        failure = f"<p id='first-failure' class='bad'>first failure: {what}</p>"
    diagnosis = "".join(f"<p class='diag'>{e(line)}</p>" for line in diagnosis_lines(store, rec))
    hang, stuck = _hang(rec, attempts)
    shown = attempts[-1]["attempt"] if attempts else rec.attempt
    choices = [(a["attempt"], name) for a in (attempts or [{"attempt": shown}])
               for name in log_files(run_dir, a["attempt"])]  # fmt: skip
    default = _log_choice(rec, choices, shown, stuck)
    opts = _options(choices, default, lambda c: f"attempt {c[0] + 1}: {c[1][:-4]}",
                    lambda c: f"{c[0]}/{c[1]}")  # fmt: skip
    logs = (
        f'<div id="logs" data-run="{e(rec.id)}" data-active="{int(rec.active)}">'
        f'<select id="log-pick">{opts}</select> '
        '<span id="log-status" class="muted"></span><pre id="log"></pre></div>'
        if choices
        else "<p class='muted' id='logs'>no logs yet</p>"
    )
    ingest(store, rec)
    metrics = store.metrics(rec.id)
    charts = (
        data("metrics-data", series(metrics)) + '<div id="metric-charts"></div>'
        if metrics
        else "<p class='muted' id='no-metrics'>no metrics recorded</p>"
    )
    return (
        f"<h1>Run <span id='run-id'>{e(rec.id)}</span> <span class='name'>{e(rec.name)}</span></h1>"
        f"<div class='actions'>{''.join(actions)}</div><dl class='facts'>{dl}</dl>"
        f"{failure}{diagnosis}{hang}"
        f"<h2>Goodput</h2>{_goodput(rec)}{_stragglers(rec)}"
        f"<h2>Attempts</h2><div id='timeline'>{_timeline(rec, attempts, procs, stuck)}</div>"
        f"{_gpus(rec)}<h2>Logs</h2>{logs}<h2>Metrics</h2>{charts}"
        f"<h2>Results</h2>{_results(store, rec)}"
        f"<h2>Resolved spec</h2><pre id='spec'>{e(_spec_text(run_dir))}</pre>"
    )


# -- sweeps ----------------------------------------------------------------------------------
def sweeps_page(store: Store) -> str:
    rows = [[_sweep_link(s), e(name), str(n), when(t)] for s, name, n, t in store.sweep_ids()]
    if not rows:
        return "<h1>Sweeps</h1><p class='muted'>no sweeps yet</p>"
    return "<h1>Sweeps</h1>" + table(["sweep", "name", "points", "created"], rows, "sweeps")


def _number(v: Any) -> float | None:
    """A parameter's value as a number to plot; None for text, inf and nan."""
    try:
        return finite(float(v))
    except (TypeError, ValueError, OverflowError):
        return None


def sweep_page(store: Store, runs: list[RunRecord], q: dict[str, str]) -> str:
    """The points' parameters against a chosen metric: `performance` (the results' value)
    or a recorded metric's last value."""
    from trebuchet.results import collect

    params = {r.id: json.loads(r.params or "{}") for r in runs}
    keys = sorted({k for p in params.values() for k in p})
    last: dict[str, dict[str, float]] = {}
    for r in runs:
        ingest(store, r)
        last[r.id] = {n: pts[-1][1] for n, pts in store.metrics(r.id).items() if pts}
    names = ["performance", *sorted({n for m in last.values() for n in m})]
    asked = q.get("metric")
    metric = asked if asked in names else "performance"
    x = q.get("x") if q.get("x") in keys else (keys[0] if keys else None)
    values: dict[str, float | None] = {}
    for r in runs:
        if metric == "performance":
            rows = collect.collect(store, r) if r.state in TERMINAL else []
            values[r.id] = next((row["performance"] for row in rows
                                 if row.get("performance") is not None), None)  # fmt: skip
        else:
            values[r.id] = last[r.id].get(metric)
    mopts, xopts = _options(names, metric), _options(keys, x)
    form = (f'<form method="get" class="filters">metric <select name="metric" id="s-metric">'
            f'{mopts}</select> against <select name="x" id="s-x">{xopts}</select>'
            '<button type="submit">show</button></form>')  # fmt: skip
    pts = [(_number(params[r.id].get(x)), values[r.id]) for r in runs if x is not None]
    pts = sorted((a, b) for a, b in pts if a is not None and b is not None)
    chart = (data("sweep-data", {"x": [a for a, _ in pts], "y": [b for _, b in pts],
                                 "xlabel": x, "ylabel": metric}) + '<div id="sweep-chart"></div>'
             if pts else "<p class='muted'>no numeric points to plot yet</p>")  # fmt: skip
    cells = [[_run_link(r), state(r.state), *[e(params[r.id].get(k, "-")) for k in keys],
              e("-" if values[r.id] is None else f"{values[r.id]:g}")] for r in runs]  # fmt: skip
    return (f"<h1>Sweep <span id='sweep-id'>{e(runs[0].sweep_id)}</span> {e(runs[0].name)}</h1>"
            f"{form}{chart}" + table(["run", "state", *[e(k) for k in keys], e(metric)], cells,
                                     "sweep"))  # fmt: skip


# -- results trends --------------------------------------------------------------------------
def results_page(store: Store, q: dict[str, str]) -> str:
    from trebuchet.results import table as results_table
    from trebuchet.results.perfcsv import number, relative_changes

    loads = results_table.workloads(store.conn)
    if not loads:
        return ("<h1>Results</h1><p class='muted'>no results yet: they are collected when a "
                "run ends (or by `treb results`)</p>")  # fmt: skip
    asked = q.get("workload") or ""
    chosen = asked if asked in {w for w, _, _ in loads} else loads[0][0]
    links = " ".join(
        f'<a class="{"chosen" if w == chosen else ""}" href="{url("/results", workload=w)}">'
        f"{e(w)} ({n})</a>"
        for w, n, _ in loads
    )
    rows = results_table.of_workload(store.conn, chosen)
    changes = relative_changes(rows)
    by_metric: dict[str, dict[str, list]] = {}
    for r in rows:
        if r.get("performance") is not None:
            s = by_metric.setdefault(r.get("metric") or "value", {"x": [], "y": []})
            s["x"].append(r["created_at"])
            s["y"].append(r["performance"])
    cells = [[f'<a href="{url("/runs/" + r["run_id"])}">{e(r["run_id"])}</a>', e(r["model"]),
              e(r["status"]), e(number(r.get("performance")) or "-"), e(r.get("metric") or "-"),
              e("-" if c is None else f"{c:+.2f}%"), e((r.get("git_commit") or "-")[:10]),
              when(r.get("created_at"))] for r, c in zip(rows, changes, strict=True)]  # fmt: skip
    chart = (data("trend-data", by_metric) + '<div id="trend-charts"></div>') if by_metric else ""
    return (f"<h1>Results</h1><p class='workloads'>{links}</p><h2>{e(chosen)}</h2>{chart}"
            + table(["run", "model", "status", "performance", "metric", "change", "commit",
                     "created"], cells, "results"))  # fmt: skip
