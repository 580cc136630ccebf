"""`treb prune --older-than AGE`: remove the ended runs older than that (dry run first
with --dry-run); never an active run."""

from __future__ import annotations

import argparse

from trebuchet.cli.filters import parse_states, parse_when
from trebuchet.errors import UserError
from trebuchet.store.db import RunFilter, Store
from trebuchet.store.states import ACTIVE, TERMINAL


def main(args: argparse.Namespace) -> int:
    from trebuchet.cli.rm_cmd import remove
    from trebuchet.runner import refresh

    states = parse_states(args.state) or sorted(TERMINAL)
    if set(states) & ACTIVE:
        raise UserError("treb prune removes ended runs only; `treb rm --force RUN` stops and "
                        "removes an active one")  # fmt: skip
    cutoff = parse_when(args.older_than, "--older-than")
    store = Store()
    refresh(store, store.list(active_only=True))  # runs whose supervisor vanished: LOST
    runs = store.list(where=RunFilter(states=states, ended_before=cutoff))
    if not runs:
        print("nothing to prune")
        return 0
    return remove(store, runs[::-1], dry_run=args.dry_run)
