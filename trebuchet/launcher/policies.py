"""Log policies: what a failed attempt's output says about retrying it.

A CUDA out-of-memory error will not go away by retrying (no_retry); a flaky node or a
port taken by someone else may (retry, bounded). The user's policies are checked first,
then these defaults unless the spec turns them off. Matching them against logs is the
runtime's (trebuchet/runtime/policies.py), the same locally and on Slurm.
"""

from __future__ import annotations

from collections.abc import Callable
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


def policies_for(spec: Any) -> list[dict[str, Any]]:
    """The spec's policies as plain dicts, then the defaults (unless turned off)."""
    own = [p.model_dump() for p in spec.log_policies]
    for i, p in enumerate(own):
        p["name"] = p["name"] or f"log_policies[{i}]"
    return own + ([dict(p) for p in DEFAULT_POLICIES] if spec.default_log_policies else [])


def retry_after(
    store: Any, run_dir: Path, run_id: str, attempt: int, state: str, retries: int,
    log_policies: list[dict[str, Any]], logs: list[Path], granted: dict[str, int],
    on_hang: str | None, say: Callable[[str], None],
) -> bool:  # fmt: skip
    """A supervisor that runs the whole job here (local, ssh), after a FAILED or TIMEOUT
    attempt that was not cancelled: whether to retry it (the one rule:
    runtime/lifecycle.next_step), with a matching policy recorded (event, attempt reason, a
    line) and the run's max_attempts raised by the retries policies granted. `granted` is
    kept by the caller."""
    from trebuchet.runtime import lifecycle, policies
    from trebuchet.store.files import append_event

    action, verdict, policy, line = lifecycle.next_step(
        state, attempt, retries, log_policies, logs, granted, on_hang=on_hang
    )
    if policy:
        name, action = policy["name"], policy["action"]
        append_event(run_dir, "log_policy", attempt=attempt, policy=name, action=action,
                     line=line)  # fmt: skip
        say(f"log policy {name} ({action}) matched: {line}")
        store.set_attempt(run_id, attempt, reason=f"{name}: {action}")
    if verdict == policies.RETRY:
        store.update_run(run_id, max_attempts=1 + retries + sum(granted.values()))
    return action == lifecycle.RETRY
