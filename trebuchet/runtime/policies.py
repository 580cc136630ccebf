"""Log policies applied to a failed attempt's logs: the first policy whose pattern occurs
decides (no_retry: final; retry: another attempt, bounded). The same code runs in the local
supervisor and in the Slurm job controller, so a pattern means the same everywhere
(Python's `re`, multiline)."""

from __future__ import annotations

import re
from typing import Any, Iterable

SCAN_BYTES = 4 << 20  # the end of each log holds the error; a huge log is not read whole


def _tail(path: Any) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - SCAN_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def match(policies: list[dict[str, Any]], logs: Iterable[Any]) -> tuple[dict[str, Any], str] | None:
    """The first policy (in order) whose pattern occurs in any log, with the matching line."""
    texts = [_tail(p) for p in logs]
    for policy in policies:
        rx = re.compile(policy["pattern"], re.M)
        for text in texts:
            m = rx.search(text)
            if m:
                start = text.rfind("\n", 0, m.start()) + 1
                end = text.find("\n", m.end())
                return policy, text[start : end if end >= 0 else len(text)].strip()[:300]
    return None
