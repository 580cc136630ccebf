"""The spec's `skypilot:` block: what only the SkyPilot engine reads (engine.py)."""

from __future__ import annotations

from typing import Literal

from trebuchet.spec.model import Block, Int, allowed

# SkyPilot's object stores (sky.data.storage.StoreType) that can hold a bucket it mounts.
STORES = ("s3", "gcs", "azure", "r2", "ibm", "oci", "nebius", "coreweave")


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
    checkpoint_bucket: str | None = allowed(
        "a bucket name, or a bucket URL such as s3://my-bucket/checkpoints",
        "a bucket mounted (file_mounts, MOUNT mode) where TREB_CHECKPOINT_DIR points, so "
        "checkpoints survive a recovery onto another node",
        default=None,
        pattern=r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9]|[a-z][a-z0-9]*://[^\s'\"]+)$",
    )
    checkpoint_store: Literal[STORES] | None = allowed(  # type: ignore[valid-type]
        "one of " + ", ".join(STORES),
        "the object store that holds checkpoint_bucket when it is a bare name (default: "
        "SkyPilot picks the cloud's own)",
        default=None,
    )
