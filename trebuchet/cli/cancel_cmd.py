"""`treb cancel`: stop a run on whatever engine runs it."""

from __future__ import annotations

import argparse

from trebuchet.backends import get_backend
from trebuchet.store.db import Store


def main(args: argparse.Namespace) -> int:
    store = Store()
    rec = store.resolve(args.run)
    if not rec.active:
        print(f"run {rec.id} already ended: {rec.state}")
        return 0
    get_backend(rec.backend).cancel(store, rec)
    rec = store.get(rec.id) or rec
    print(f"run {rec.id} {rec.state}")
    return 0
