"""The spec's `skypilot:` block: what only the SkyPilot engine reads (backends/skypilot.py)."""

from __future__ import annotations

from trebuchet.spec.model import Block, Int, allowed


class SkyPilot(Block):
    """SkyPilot-specific settings"""

    cloud: str | None = allowed("a cloud name", "resources.cloud", default=None)
    accelerators: str | None = allowed(
        "an accelerator spec such as H100:8", "resources.accelerators", default=None
    )
    use_spot: bool | None = allowed("true or false", "resources.use_spot", default=None)
    region: str | None = allowed("a region name", "resources.region", default=None)
    disk_size: Int | None = allowed(
        "an integer between 1 and 65536 (GB)", "resources.disk_size", default=None, ge=1,
        le=65536,
    )  # fmt: skip
