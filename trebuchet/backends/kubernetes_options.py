"""The spec's `kubernetes:` block: what only the Kubernetes engine reads
(backends/kubernetes.py)."""

from __future__ import annotations

from trebuchet.spec.model import Block, allowed


class Kubernetes(Block):
    """Kubernetes-specific settings"""

    namespace: str | None = allowed("a namespace name", "Kubernetes namespace", default=None)
    image: str | None = allowed("a container image reference", "pod image", default=None)
