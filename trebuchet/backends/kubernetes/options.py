"""The spec's `kubernetes:` block: what only the Kubernetes engine reads (engine.py)."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from trebuchet.spec.model import Block, allowed


class Kubernetes(Block):
    """Kubernetes-specific settings"""

    namespace: str | None = allowed("a namespace name", "Kubernetes namespace", default=None)
    image: str | None = allowed("a container image reference", "pod image", default=None)
    code_dir: str | None = allowed(
        "an absolute path",
        "where the image holds the code: the pod runs there and nothing is shipped "
        "(default: the run's code snapshot is shipped in the ConfigMap)",
        default=None,
        pattern=r"^/[^\s'\"]*$",
    )
    cpu: str | None = allowed(
        "a Kubernetes CPU quantity such as 8 or 500m",
        "CPUs each pod requests (default: one per rank of the pod)",
        default=None,
        pattern=r"^([0-9]+(\.[0-9]+)?|[0-9]+m)$",
    )
    memory: str | None = allowed(
        "a Kubernetes memory quantity such as 64Gi or 512Mi",
        "memory each pod requests (default: none asked)",
        default=None,
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$",
    )
    checkpoint_volume: str | None = allowed(
        "a PersistentVolumeClaim name",
        "a PVC mounted where TREB_CHECKPOINT_DIR points, so checkpoints survive a retried "
        "pod (ReadWriteMany with several nodes)",
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
    )

    @field_validator("cpu", mode="before")
    @classmethod
    def _number_as_quantity(cls, value: Any) -> Any:
        """`cpu: 8` (a YAML number) is the quantity "8"."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return format(value, "g")
        return value
