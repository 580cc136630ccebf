"""`treb diagnose`: the root cause of a failure, of a run or of logs from anywhere (a
torchrun console log, an srun job log, a per-rank log directory, a copied run directory):
an argument that names an existing file or directory is read as logs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trebuchet.errors import UserError


def main(args: argparse.Namespace) -> int:
    from trebuchet.diagnose import report

    targets: list[str] = list(args.targets)
    if any(not t.strip() for t in targets):  # Path('') is the current folder: never meant
        raise UserError("an empty RUN names no run: give a run id, a prefix of one or a name")
    paths = [Path(t) for t in targets if Path(t).exists()]
    if paths and len(paths) != len(targets):
        missing = [t for t in targets if not Path(t).exists()]
        raise UserError(f"no such file or directory: {', '.join(missing)}")
    odd = [str(p) for p in paths if not (p.is_file() or p.is_dir())]
    if odd:  # a FIFO, a socket, a device: not read, and not silently skipped either
        raise UserError(f"not a regular file or a directory: {', '.join(odd)}")
    if paths:
        d = report.diagnose_paths(paths)
    else:
        if len(targets) > 1:
            raise UserError("give one run id, or log files that exist")
        from trebuchet.runner import refresh
        from trebuchet.store.db import Store

        store = Store()
        try:
            rec = store.resolve(targets[0] if targets else None)
        except UserError:
            if targets and ("/" in targets[0] or "." in targets[0]):
                raise UserError(f"no such file or directory: {targets[0]}") from None
            raise
        refresh(store, [rec])
        rec = store.get(rec.id) or rec
        d = report.diagnose_record(store, rec)
    if args.json:
        print(json.dumps(d.to_json(), indent=2))
    else:
        sys.stdout.write(report.text(d))
    return 0
