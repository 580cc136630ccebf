"""Hosts with a bad history across runs (store/nodes.py, docs/nodes.md) left out of a new
ssh run when the spec lists more hosts than it needs (nodes + spare_nodes), in the order
listed; when it cannot leave them out, an error naming them. A host is its node name
(`user@` left out); `allow_nodes` keeps one in."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TypeVar

from trebuchet.errors import UserError
from trebuchet.store.node_events import node_name
from trebuchet.store.nodes import Node, avoided, note, why

H = TypeVar("H")


def choose(listed: Sequence[H], names: Sequence[str], need: int, allow: Sequence[str],
           where: str, say: bool = False) -> list[H]:  # fmt: skip
    """The first `need` of `listed` (whose host names are `names`) that are not avoided."""
    bad: dict[str, Node] = {n.host: n for n in avoided(allow)}
    if not bad:
        return list(listed[:need])
    keep = [i for i, name in enumerate(names) if node_name(name) not in bad]
    if len(keep) < need:
        held = [bad[n] for name in names if (n := node_name(name) or "") in bad]
        raise UserError(
            f"{where}: {need} host(s) needed, but of the {len(names)} listed "
            f"{len(held)} have a bad history across runs: {'; '.join(why(n) for n in held)}. "
            "List more hosts, allow these (allow_nodes: [HOST] in the spec), or forget their "
            "history (`treb nodes --clear HOST`; `treb nodes` shows it)"
        )
    used = keep[:need]
    skipped = [bad[n] for i, name in enumerate(names[: used[-1] + 1] if used else [])
               if (n := node_name(name) or "") in bad]  # fmt: skip
    if skipped and say:
        print(note(skipped, "ssh hosts skipped"), file=sys.stderr)
    return [listed[i] for i in used]
