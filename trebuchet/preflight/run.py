"""Run every check, drop what the spec silences, and (for `treb run`) refuse errors."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from trebuchet.preflight import horovod, launchers, parallelism, requeue, storage, timelimit
from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import CHECKS, WARNING, Finding, count

if TYPE_CHECKING:
    from trebuchet.backends.base import Backend
    from trebuchet.spec.load import LoadedSpec

Check = Callable[[Context], list[Finding]]
# The checks for every engine; an engine adds its own (Backend.preflight).
ALL_CHECKS: tuple[Check, ...] = (
    storage.host_inputs,
    storage.node_local_cache,
    storage.node_local_workdir,
    timelimit.time_limit,
    parallelism.parallel_sizes,
    launchers.nested_launchers,
    launchers.torchrun_nnodes,
    requeue.self_requeue,
    horovod.horovod_build,
)


def _line(f: Finding) -> int:
    _, _, tail = f.where.rpartition(":")
    return int(tail) if tail.isdigit() else 1 << 30


def preflight(
    loaded: LoadedSpec, engine: Backend, environ: Mapping[str, str] | None = None
) -> list[Finding]:
    """The findings for `loaded` on `engine` the spec does not silence, errors first."""
    ctx = Context(loaded, engine, os.environ if environ is None else environ)
    findings = all_findings(ctx)
    ignored = set(getattr(ctx.spec, "ignore_checks", None) or ())
    kept = [f for f in findings if f.id not in ignored]
    return sorted(kept, key=lambda f: (not f.is_error, _line(f)))


def all_findings(ctx: Context) -> list[Finding]:
    """Every finding, silenced ones included."""
    out: list[Finding] = []
    for check in ALL_CHECKS:
        out += check(ctx)
    out += ctx.engine.preflight(ctx)
    known = CHECKS.keys() | ctx.engine.check_ids.keys()
    for i, name in enumerate(getattr(ctx.spec, "ignore_checks", None) or ()):
        if name not in known:
            out.append(
                ctx.finding(
                    "unknown-check-id",
                    WARNING,
                    f"ignore_checks: {name!r} is not a check id, so it silences nothing",
                    "use an id from `treb check` output or docs/preflight.md",
                    "ignore_checks",
                    i,
                )
            )
    return out


def enforce(
    loaded: LoadedSpec, engine: Backend, environ: Mapping[str, str] | None = None
) -> list[Finding]:
    """For `treb run` and launch(): the warnings; SpecError (exit 2) when there are errors.
    Printing is the caller's (the CLI prints, the API keeps them on the Run)."""
    from trebuchet.errors import SpecError

    findings = preflight(loaded, engine, environ)
    errors = [f for f in findings if f.is_error]
    if errors:
        lines = [line for f in errors for line in f.text().splitlines()]
        lines.append(
            f"preflight: {count(errors)}, nothing was started (silence one with "
            "`ignore_checks: [ID]` in the spec, or skip all checks with --no-check)"
        )
        raise SpecError(lines)
    return findings
