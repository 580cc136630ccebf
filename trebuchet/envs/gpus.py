"""Which GPUs each simulated node's ranks see, with madengine's bare-metal semantics.

-1 keeps a mask the user or scheduler already exported (or takes every detected device);
N takes the first N of that mask (or 0..N-1). Simulated nodes split the devices.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

MASK_VARS = {
    "nvidia": ["CUDA_VISIBLE_DEVICES"],
    "amd": ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"],
}


class GpuError(ValueError):
    """A GPU request this machine cannot satisfy."""


def detect() -> tuple[str, list[str]]:
    """(vendor, device ids) of this machine; the one place that asks the hardware.
    TREB_FAKE_GPUS=vendor:count stands in for hardware that cannot exist on a test
    machine (it is how the tests exercise masks without a GPU)."""
    fake = os.environ.get("TREB_FAKE_GPUS")
    if fake:
        vendor, _, count = fake.partition(":")
        return vendor, [str(i) for i in range(int(count or 0))]
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "-L"])
        return "nvidia", [str(i) for i, ln in enumerate(out.splitlines()) if ln.startswith("GPU ")]
    if shutil.which("rocm-smi") or os.path.exists("/dev/kfd"):
        out = _run(["rocm-smi", "--showid"]) if shutil.which("rocm-smi") else ""
        ids = sorted(
            {ln.split("]")[0].split("[")[1] for ln in out.splitlines() if ln.startswith("GPU[")}
        )
        return "amd", ids
    return "none", []


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def existing_mask(vendor: str, environ: Mapping[str, str]) -> list[str] | None:
    """The devices a mask already in the environment allows, or None when there is none."""
    for var in MASK_VARS.get(vendor, []):
        value = environ.get(var)
        if value is not None:
            return [d.strip() for d in value.split(",") if d.strip()]
    return None


def node_masks(
    requested: int, mask: list[str] | None, detected: list[str], nodes: int
) -> list[list[str]]:
    """The devices of each simulated node; raises GpuError when there are too few."""
    pool = mask if mask is not None else detected
    where = "in the existing mask" if mask is not None else "detected"
    if requested == 0:
        return [[] for _ in range(nodes)]
    if requested == -1:
        per = len(pool) // nodes
        if pool and per == 0:
            raise GpuError(f"{len(pool)} GPU(s) {where} cannot be split over {nodes} nodes")
        return [pool[i * per : (i + 1) * per] for i in range(nodes)]
    if requested * nodes > len(pool):
        raise GpuError(
            f"{requested} x {nodes} node(s) needs {requested * nodes} GPU(s); "
            f"{len(pool)} {where} on this machine"
        )
    return [pool[i * requested : (i + 1) * requested] for i in range(nodes)]


def gpu_env(vendor: str, devices: list[str], requested: int) -> dict[str, str]:
    """The variables a rank gets: the vendor's mask (unless no GPUs were asked for) and
    TREB_NGPUS with the count in every case."""
    env = {"TREB_NGPUS": str(len(devices))}
    if requested != 0:
        for var in MASK_VARS.get(vendor, []):
            env[var] = ",".join(devices)
    return env
