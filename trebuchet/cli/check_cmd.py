"""`treb check`: the preflight findings for a spec on an engine, and what the engine
itself would refuse, before anything is queued. Exit 1 on errors (warnings allowed)."""

from __future__ import annotations

import argparse
import json
import re

from trebuchet.errors import SpecError, UserError
from trebuchet.preflight import ERROR, Finding, preflight
from trebuchet.preflight.findings import count
from trebuchet.preflight.hangs import suggestions
from trebuchet.spec.load import load_spec


def _engine_refusals(loaded, backend_name: str) -> list[Finding]:
    """What `treb run` would refuse in the engine's own check, as findings."""
    from trebuchet.backends import get_backend

    try:
        get_backend(backend_name).check(loaded)
    except SpecError as exc:
        problems = exc.problems
    except UserError as exc:
        problems = str(exc).splitlines()
    else:
        return []
    out = []
    for text in problems:
        head, sep, rest = text.partition(": ")
        if sep and re.search(r":\d+$", head):
            where, message = head, rest
        elif sep and head in (loaded.source, str(loaded.path)):
            where, message = loaded.where(), rest
        else:
            where, message = loaded.where(), text
        fix = f"`treb run --on {backend_name}` stops here; change what the message names"
        out.append(Finding("backend-refuses", ERROR, message, fix, where))
    return out


def main(args: argparse.Namespace) -> int:
    from trebuchet.backends import get_backend, option_models

    if getattr(args, "nodes", None) is not None:  # the nodes' health checks, now
        from trebuchet.cli.node_check import main as node_check

        return node_check(args)
    if not args.spec:
        raise UserError("treb check: a SPEC (or --nodes N for the nodes' health checks)")

    engine = get_backend(args.on)  # an unknown engine: exit 2, before the spec is read
    loaded = load_spec(args.spec, args.override)
    findings = preflight(loaded, engine)
    findings = _engine_refusals(loaded, args.on) + findings
    errors = sum(f.is_error for f in findings)
    advice = suggestions(loaded.spec)
    if args.json:
        print(json.dumps({
            "spec": loaded.source, "backend": args.on, "ok": errors == 0, "errors": errors,
            "warnings": len(findings) - errors, "findings": [f.as_dict() for f in findings],
            "suggestions": advice,
        }, indent=2))  # fmt: skip
    else:
        for f in findings:
            print(f.text())
        for text in advice:
            print(f"{loaded.where('nodes')}: suggestion: {text}")
        print(f"treb check: {count(findings)} ({loaded.source}, --on {args.on})")
        models = dict(option_models())
        blocks = [b for b in models if getattr(loaded.spec, b).model_fields_set]
        if blocks and args.on not in models:  # an engine without a block ignores them
            print(f"treb check: the spec has a {blocks[0]} block; `--on {blocks[0]}` adds the "
                  "checks for that engine (multi-node paths, partition size)")  # fmt: skip
    return 1 if errors else 0
