"""A SkyPilot job's log, as `sky tail_logs` returns it, turned back into each node's output.

Why: SkyPilot prefixes every line a node prints with where it came from (its log_lib:
`(head, rank=0, pid=P) `, `(worker1, rank=1, pid=P, ip=IP) `, `(setup pid=P, ip=IP) `),
often in colour, before the node agents' labels: the log loses it before node_logs.split
reads the labels; its rank says which node an unlabelled line came from.
"""

from __future__ import annotations

import re

COLOUR = r"(?:\x1b\[[0-9;]*m)*"  # colorama's codes around the prefix (not the line's own)
PREFIX = re.compile(rf"^{COLOUR}\(([^()]*?)pid=\d+(?:, ip=([^()\s]+))?\){COLOUR} ?")
RANK = re.compile(r"\brank=(\d+),")


def by_node(text: str) -> dict[int, str]:
    """{node rank: its lines without SkyPilot's prefix}. A setup line names its node by
    its IP alone (the head's by none): the rank of that IP's `run:` lines; lines with no
    prefix (SkyPilot's own) are node 0's. Lines end at \n only: a rank's U+2028 stays in
    its line, behind its prefix."""
    rows: list[tuple[str, str | None, str]] = []  # (inside the prefix, ip, rest)
    ranks: dict[str, int] = {}
    lines = text.split("\n")
    if lines[-1] == "":  # the last line's end, or no text at all
        lines.pop()
    for line in lines:
        m = PREFIX.match(line)
        if not m:
            rows.append(("", None, line))
            continue
        inside, ip, rest = m.group(1), m.group(2), line[m.end() :]
        rank = RANK.search(inside)
        if rank and ip:
            ranks.setdefault(ip, int(rank.group(1)))
        rows.append((inside, ip, rest))
    out: dict[int, list[str]] = {}
    for inside, ip, rest in rows:
        rank = RANK.search(inside)
        node = int(rank.group(1)) if rank else ranks.get(ip or "", 0)
        out.setdefault(node, []).append(rest)
    return {node: "".join(f"{line}\n" for line in lines) for node, lines in out.items()}
