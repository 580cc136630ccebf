"""HTML building with escaping by default: every value that reaches a page goes through
e() (run names, log lines, specs and parameters are hostile input); data for the charts
travels as JSON in <script type="application/json">, escaped so it cannot close the tag."""

from __future__ import annotations

import json
import math
import time
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

STATE_CLASS = {
    "SUCCEEDED": "ok", "FAILED": "bad", "TIMEOUT": "bad", "LOST": "bad", "CANCELLED": "off",
    "RUNNING": "live", "RETRYING": "live", "PENDING": "wait",
}  # fmt: skip


def e(value: Any) -> str:
    return "" if value is None else escape(str(value), quote=True)


def url(path: str, **query: Any) -> str:
    """A path with its query, each part quoted; None values are left out."""
    q = urlencode({k: v for k, v in query.items() if v not in (None, "")})
    return e(quote(path) + (f"?{q}" if q else ""))


def state(value: str) -> str:
    return f'<span class="state {STATE_CLASS.get(value, "")}">{e(value)}</span>'


def when(ts: float | None) -> str:
    return "-" if not ts else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def finite(value: Any) -> Any:
    """`value` with every float that JSON has no word for (inf, -inf, nan) as None: the
    page's JSON.parse refuses `Infinity` and `NaN` (a rank may print `loss: inf`)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def data(element_id: str, value: Any) -> str:
    text = json.dumps(finite(value), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e")
    text = text.replace("&", "\\u0026")
    return f'<script type="application/json" id="{e(element_id)}">{text}</script>'


def table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table; cells are HTML already (escape them with e() when building them)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, body: str, scripts: bool = False) -> str:
    js = ('<script src="/static/uPlot.iife.min.js"></script>'
          '<script src="/static/app.js"></script>') if scripts else ""  # fmt: skip
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} - treb ui</title>"
        '<link rel="stylesheet" href="/static/uPlot.min.css">'
        '<link rel="stylesheet" href="/static/style.css"></head><body>'
        '<nav><a class="brand" href="/">trebuchet</a> <a href="/">runs</a> '
        '<a href="/sweeps">sweeps</a> <a href="/results">results</a></nav>'
        f"<main>{body}</main>{js}</body></html>"
    )
