"""Log policies: what a failed attempt's output says about retrying it.

A CUDA out-of-memory error will not go away by retrying (no_retry); a flaky node or a
port taken by someone else may (retry, bounded). The user's policies are checked first,
then these defaults unless the spec turns them off. Matching them against logs is the
runtime's (trebuchet/runtime/watch/log_policies.py), and what follows a failed attempt the job
controller's (runtime/lifecycle.next_step): the same on every engine.
"""

from __future__ import annotations

from typing import Any

from trebuchet.runtime.contracts.schema import LogPolicy

DEFAULT_POLICIES: list[LogPolicy] = [
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


def policies_for(spec: Any) -> list[LogPolicy]:
    """The spec's policies as plain dicts, then the defaults (unless turned off)."""
    own = [p.model_dump() for p in spec.log_policies]
    for i, p in enumerate(own):
        p["name"] = p["name"] or f"log_policies[{i}]"
    return own + ([dict(p) for p in DEFAULT_POLICIES] if spec.default_log_policies else [])
