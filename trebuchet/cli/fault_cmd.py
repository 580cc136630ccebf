"""`treb fault`: a fault injected into a running run, to see the recovery work where it is
used (as submitit's `_interrupt` and Megatron Bridge's `simulate_fault`). Recorded as a
`fault` event before it is injected, on the node itself, by the runtime's `fault` verb
(runtime/node/fault.py) as each engine reaches its nodes (backends/<engine>/fault.py).
Exit 1 when nothing was there to hit."""

from __future__ import annotations

import argparse
from pathlib import Path

from trebuchet.backends import get_backend, names
from trebuchet.errors import UserError
from trebuchet.runtime.node import fault
from trebuchet.store.files import append_event


def _node(nodes: list[str], word: str) -> tuple[int, str]:
    """NODE as an index (0 is the master) or a name, checked against the run's nodes."""
    if word.isdigit() and int(word) < len(nodes):
        return int(word), nodes[int(word)]
    if word in nodes:
        return nodes.index(word), word
    raise UserError(f"node {word!r}: the run's nodes are {', '.join(nodes) or 'unknown'} "
                    f"(or 0..{len(nodes) - 1})")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from trebuchet.store.db import Store

    store = Store()
    rec = store.resolve(args.run)
    engine = get_backend(rec.backend)
    if not engine.faults:
        able = [n for n in names() if get_backend(n).faults]
        raise UserError(f"treb fault: not on {rec.backend} (only {', '.join(able)})")
    if rec.state not in ("RUNNING", "RETRYING"):
        raise UserError(f"treb fault: run {rec.id} is {rec.state}, not running")
    run_dir = Path(rec.run_dir)
    action, target = args.action, args.target
    if action in (fault.KILL_NODE, fault.HANG_RANK) and target is None:
        raise UserError(
            f"treb fault {action}: say which {'node' if action == fault.KILL_NODE else 'rank'}"
        )
    if action == fault.PREEMPT and target is not None:
        raise UserError("treb fault preempt: takes no NODE or RANK")
    world = int(rec.nodes or 1) * int(rec.procs_per_node or 1)
    node = host = None
    if action == fault.KILL_NODE:
        node, host = _node(engine.fault_nodes(rec), str(target))
    elif action == fault.HANG_RANK and not (str(target).isdigit() and int(target) < world):
        raise UserError(f"rank {target!r}: the run has ranks 0..{world - 1}")
    att = fault.latest_attempt(str(run_dir))
    attempt = int(Path(att).name.split("-")[1]) if att else 0
    append_event(run_dir, "fault", fault=action, node=node, host=host, attempt=attempt,
                 rank=int(target) if action == fault.HANG_RANK else None,
                 by="treb fault")  # fmt: skip
    code = engine.inject_fault(rec, action, target, node, host)
    print(f"treb fault: {action}{f' {target}' if target is not None else ''} on run {rec.id} "
          f"({rec.backend}): {'injected' if code == 0 else 'nothing was hit'}")  # fmt: skip
    return 0 if code == 0 else 1
