"""`treb ui`: the web dashboard (trebuchet/ui/), from the optional `ui` extra."""

from __future__ import annotations

import argparse
import importlib.util

from trebuchet.errors import UserError

INSTALL = "pip install 'trebuchet[ui]'"


def main(args: argparse.Namespace) -> int:
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"treb ui needs the web extra ({', '.join(missing)} not installed): {INSTALL}"
        )
    from trebuchet.ui.security import new_token
    from trebuchet.ui.server import serve

    serve(args.host, args.port, new_token())
    return 0
