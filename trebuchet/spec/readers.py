"""What the node agent's readers take from a spec, as plain data: `metrics.json`.

The agent's one log reader feeds the metrics (runtime/watch/metric_reader.py) and the first rank's
progress (runtime/watch/eta.py); its GPU sampler and the job controller's idle-GPU rule read
runtime/watch/gpu.py's part. They all read one file, written at submission in the run directory
(and, for the engines whose nodes have their own run directory, carried in the job file):
the spec's `metrics:` block, plus `gpus` (gpus_per_node), `idle_gpu_timeout` (seconds)
and `idle_gpu_action`.
"""

from __future__ import annotations

from typing import Any


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
    return data


def needed(spec: Any) -> bool:
    """Whether the job file must carry it: not the defaults (the runtime's when absent)."""
    wanted = getattr(spec, "metrics", None)
    if wanted is not None and wanted.model_fields_set:
        return True
    return bool(getattr(spec, "gpus_per_node", 0) or getattr(spec, "idle_gpu_timeout", None))
