"""A time limit must leave room for the checkpoint the warning signal asks for.

The checkpoint signal goes out `warning` seconds before the limit (the spec's
timeout_warning, default min(60 s, 10 %)). A limit shorter than the warning plus a margin
(60 s, or the warning itself when longer) leaves the ranks no time to work before they
are asked to checkpoint, or no time to finish writing one (a torn checkpoint).
"""

from __future__ import annotations

from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import WARNING, Finding
from trebuchet.spec.duration import human

MARGIN_S = 60.0


def _limit(ctx: Context) -> tuple[float, tuple[str, ...], str] | None:
    """(seconds, field path, field name) of the limit the run will be held to: the
    engine's own (slurm.time) when its block sets one, else the spec's timeout."""
    own = ctx.engine.time_limit(ctx.loaded)
    if own is not None:  # unlimited (None seconds): nothing to check
        return (own[0], own[1], ".".join(own[1])) if own[0] else None
    if ctx.spec.timeout:
        return ctx.spec.timeout, ("timeout",), "timeout"
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
