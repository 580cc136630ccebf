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


RETRY, FINAL, EXHAUSTED, NO_MATCH = "retry", "final", "exhausted", "no match"


def decide(
    policies: list[dict[str, Any]], logs: Iterable[Any], granted: dict[str, int]
) -> tuple[str, dict[str, Any] | None, str]:
    """After a failed attempt, what the log policies say: (verdict, policy, line).

    RETRY: a retry policy matched and grants one more attempt (counted in `granted`, which
    the caller keeps: in memory locally, in a file on Slurm where a requeue restarts the
    job); FINAL: a no_retry policy matched; EXHAUSTED: a retry policy matched but has
    granted all it may (then the spec's retries decide, as for NO_MATCH)."""
    found = match(policies, logs)
    if not found:
        return NO_MATCH, None, ""
    policy, line = found
    if policy["action"] != "retry":
        return FINAL, policy, line
    name = policy["name"]
    if granted.get(name, 0) >= int(policy.get("max_retries", 3)):
        return EXHAUSTED, policy, line
    granted[name] = granted.get(name, 0) + 1
    return RETRY, policy, line
