"""The spec's `kubernetes:` block: what only the Kubernetes engine reads (engine.py)."""

from __future__ import annotations

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
    checkpoint_volume: str | None = allowed(
        "a PersistentVolumeClaim name",
        "a PVC mounted where TREB_CHECKPOINT_DIR points, so checkpoints survive a retried "
        "pod (ReadWriteMany with several nodes)",
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$",
    )
