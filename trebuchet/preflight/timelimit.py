"""A time limit must leave room for the checkpoint the warning signal asks for.

The checkpoint signal goes out `warning` seconds before the limit (the spec's
timeout_warning, default min(60 s, 10 %)). A limit shorter than the warning plus a margin
(60 s, or the warning itself when longer) leaves the ranks no time to work before they
are asked to checkpoint, or no time to finish writing one (a torn checkpoint).
"""

from __future__ import annotations

import re

from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import WARNING, Finding
from trebuchet.spec.duration import human

MARGIN_S = 60.0
SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def slurm_seconds(text: str) -> float | None:
    """Seconds in a Slurm --time value, read as Slurm does (a bare number is minutes);
    None when unlimited or not a Slurm time (the backend reports that one itself)."""
    m = SLURM_TIME.fullmatch(text.strip())
    if not m:
        return None
    d, a, b, c = (int(x) if x else None for x in m.groups())
    if d is not None:  # D-H, D-H:M, D-H:M:S
        return float(d * 86400 + (a or 0) * 3600 + (b or 0) * 60 + (c or 0))
    if c is not None:  # H:M:S
        return float(a * 3600 + (b or 0) * 60 + c)
    if b is not None:  # M:S
        return float(a * 60 + b)
    return a * 60.0  # M


def _limit(ctx: Context) -> tuple[float, tuple[str, ...], str] | None:
    """(seconds, field path, field name) of the limit the run will be held to."""
    spec = ctx.spec
    if ctx.backend == "slurm" and spec.slurm.time:
        seconds = slurm_seconds(spec.slurm.time)
        return (seconds, ("slurm", "time"), "slurm.time") if seconds else None
    if spec.timeout:
        return spec.timeout, ("timeout",), "timeout"
    return None


def time_limit(ctx: Context) -> list[Finding]:
    found = _limit(ctx)
    if found is None:
        return []
    limit, path, field = found
    spec = ctx.spec
    explicit = spec.timeout_warning
    warning = min(explicit, limit) if explicit is not None else min(60.0, 0.1 * limit)
    needed = max(warning + MARGIN_S, 2 * warning)
    if limit >= needed:
        return []
    return [
        ctx.finding(
            "time-limit-short",
            WARNING,
            f"{field} {human(limit)} leaves no room for the checkpoint warning: "
            f"{spec.checkpoint_signal} comes {human(warning)} before the end, and the limit "
            f"should be at least {human(needed)} (the warning plus max(60 s, the warning))",
            f"raise {field} to {human(needed)} or more"
            + (", or shorten timeout_warning" if explicit is not None else ""),
            *path,
        )
    ]
