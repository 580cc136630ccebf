"""What the node agent's readers take from a spec, as plain data: `metrics.json`, one file
for the log reader, the GPU sampler, the idle-GPU rule and the straggler watch, written at
submission (and carried in the job file for engines whose nodes have their own run dir).
"""

from __future__ import annotations

from typing import Any

from trebuchet.runtime.watch.straggler import THRESHOLD


def reader_config(spec: Any) -> dict[str, Any]:
    """The spec's metrics block and GPU watch as metrics.json holds them."""
    data: dict[str, Any] = spec.metrics.model_dump()
    gpus = getattr(spec, "gpus_per_node", 0) or 0
    if gpus:
        data["gpus"] = gpus
    idle = getattr(spec, "idle_gpu_timeout", None)
    if idle:
        data["idle_gpu_timeout"] = idle
        data["idle_gpu_action"] = getattr(spec, "idle_gpu_action", "warn")
    if getattr(spec, "checkpoint_pattern", None) is not None:  # runtime/watch/marks.py
        data["checkpoint_pattern"] = spec.checkpoint_pattern
    threshold = getattr(spec, "straggler_threshold", THRESHOLD)
    if threshold != THRESHOLD:  # runtime/watch/straggler.py
        data["straggler_threshold"] = threshold
    return data


def needed(spec: Any) -> bool:
    """Whether the job file must carry it: not the defaults (the runtime's when absent)."""
    wanted = getattr(spec, "metrics", None)
    if wanted is not None and wanted.model_fields_set:
        return True
    if getattr(spec, "checkpoint_pattern", None) is not None:
        return True
    if getattr(spec, "straggler_threshold", THRESHOLD) != THRESHOLD:
        return True
    return bool(getattr(spec, "gpus_per_node", 0) or getattr(spec, "idle_gpu_timeout", None))
