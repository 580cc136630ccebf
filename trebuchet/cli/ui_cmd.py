"""`treb ui`: the web dashboard (trebuchet/ui/), from the optional `ui` extra."""

from __future__ import annotations

import argparse
import importlib

from trebuchet.errors import UserError

INSTALL = "pip install 'trebuchet[ui]'"


def main(args: argparse.Namespace) -> int:
    missing = [m for m in ("starlette", "uvicorn") if not importable(m)]
    if missing:
        raise UserError(
            f"treb ui needs the ui extra ({', '.join(missing)} not installed): {INSTALL}"
        )
    from trebuchet.ui.security import new_token
    from trebuchet.ui.server import serve

    serve(args.host, args.port, new_token())
    return 0


def importable(module: str) -> bool:
    """Whether `module` imports: found is not enough (a broken or half-removed install is
    found and then fails); the server imports it next anyway."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
