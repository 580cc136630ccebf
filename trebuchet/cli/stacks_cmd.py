"""`treb stacks`: the Python stacks of every rank of a running run, grouped, asked of the
node agents through a request file in the attempt's directory (runtime/watch/stacks.py),
so it works where this machine sees every node's run directory
(Backend.agents_share_run_dir). The run goes on."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trebuchet.errors import TrebError, UserError


def main(args: argparse.Namespace) -> int:
    from trebuchet.backends import get_backend
    from trebuchet.diagnose.hang import grouped_text, read_stacks
    from trebuchet.runner import refresh
    from trebuchet.runtime.watch import hung as hang
    from trebuchet.runtime.watch import stacks
    from trebuchet.store.db import Store

    store = Store()
    rec = store.resolve(args.run)
    refresh(store, [rec])
    rec = store.get(rec.id) or rec
    if not get_backend(rec.backend).agents_share_run_dir(rec):
        raise UserError(
            f"treb stacks reads the ranks' stacks from the run directory, which the "
            f"{rec.backend} nodes of run {rec.id} keep to themselves: local and Slurm runs, "
            "and ssh runs whose run directory is shared with the hosts"
        )
    if rec.state != "RUNNING":
        raise TrebError(f"run {rec.id} is {rec.state}: stacks need its ranks running"
                        + (" (a hang's stacks stay in attempt-<n>/stacks/)"
                           if rec.state in ("FAILED", "TIMEOUT") else ""))  # fmt: skip
    adir = Path(rec.run_dir) / f"attempt-{rec.attempt}"
    expected = hang.expected_names(rec.launcher, rec.nodes, rec.procs_per_node)
    rid = stacks.request(str(adir))
    deadline = time.monotonic() + args.wait
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        got = stacks.answered(str(adir), rid)
        if len(got) >= len(expected):
            break
        time.sleep(0.2)
    ranks = read_stacks(adir, sorted(got))
    texts = {r.name: stack_text(got[r.name]) for r in ranks}
    # attempts from 1, as `treb status` and `treb logs --attempt` count them (dirs: from 0)
    print(f"run {rec.id} ({rec.name}), attempt {rec.attempt + 1}: stacks of {len(ranks)} of "
          f"{len(expected)} ranks, in {adir / 'stacks'}\n")  # fmt: skip
    print(grouped_text(ranks, texts))
    missing = [n for n in expected if n not in got]
    if missing:
        print(f"treb: no stacks within {args.wait:g}s from {', '.join(missing)} (has the "
              "attempt started them? is the node agent alive?)", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def stack_text(path: str | Path) -> str:
    """A stack file's text ('' when it is gone or not a regular file: runtime/rundir/regular.py)."""
    from trebuchet.runtime.rundir.regular import read_text

    try:
        return read_text(path)
    except OSError:
        return ""
