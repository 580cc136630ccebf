"""Log policies: what a failed attempt's output says about retrying it.

A CUDA out-of-memory error will not go away by retrying (no_retry); a flaky node or a
port taken by someone else may (retry, bounded). The user's policies are checked first,
then these defaults unless the spec turns them off.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DEFAULT_POLICIES: list[dict[str, Any]] = [
    {"name": "gpu-oom", "action": "no_retry",
     "pattern": r"CUDA out of memory|torch\.(cuda\.)?OutOfMemoryError|HIP out of memory"
                r"|CUBLAS_STATUS_ALLOC_FAILED"},
    {"name": "missing-module", "action": "no_retry",
     "pattern": r"ModuleNotFoundError: No module named|ImportError: cannot import name"},
    {"name": "syntax-error", "action": "no_retry",
     "pattern": r"^\s*(SyntaxError|IndentationError): "},
    {"name": "ecc-error", "action": "retry", "max_retries": 2,
     "pattern": r"uncorrectable ECC error|ECC error encountered"},
    {"name": "port-in-use", "action": "retry", "max_retries": 2,
     "pattern": r"EADDRINUSE|Address already in use"},
]  # fmt: skip

SCAN_BYTES = 4 << 20  # the end of each log holds the error; a huge log is not read whole


def policies_for(spec: Any) -> list[dict[str, Any]]:
    """The spec's policies as plain dicts, then the defaults (unless turned off)."""
    own = [p.model_dump() for p in spec.log_policies]
    for i, p in enumerate(own):
        p["name"] = p["name"] or f"log_policies[{i}]"
    return own + ([dict(p) for p in DEFAULT_POLICIES] if spec.default_log_policies else [])


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - SCAN_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def match(
    policies: list[dict[str, Any]], logs: Iterable[Path]
) -> tuple[dict[str, Any], str] | None:
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
