"""The spec's recovery fields as every engine's job file and the local plan carry them:
the exit-code rules (runtime/job/retry_codes.py) and the node health checks' settings
(runtime/node/health.py). One place, so that the engines hand the runtime the same values."""

from __future__ import annotations

from typing import Any


def exit_code_rules(spec: Any) -> dict[str, list[int]]:
    """no_retry_exit_codes / retry_exit_codes, only when set."""
    out: dict[str, list[int]] = {}
    if getattr(spec, "no_retry_exit_codes", None):
        out["no_retry_exit_codes"] = list(spec.no_retry_exit_codes)
    if getattr(spec, "retry_exit_codes", None) is not None:
        out["retry_exit_codes"] = list(spec.retry_exit_codes)
    return out


def health_fields(spec: Any) -> dict[str, Any]:
    """What the nodes' health checks need beyond the rank contract, only when set: the
    spec's own check and its timeout, the GPUs a node must show."""
    out: dict[str, Any] = {}
    if getattr(spec, "health_check", None):
        out["health_check"] = spec.health_check
        out["health_check_timeout"] = float(spec.health_check_timeout)
    gpus = getattr(spec, "gpus_per_node", 0) or 0
    if gpus > 0:
        out["gpus_per_node"] = int(gpus)
    return out
