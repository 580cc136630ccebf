"""Issue 27's GPU parts on a machine with a real NVIDIA (or AMD) GPU and torch with CUDA/ROCm:
what the tests can only check with a stand-in `nvidia-smi`.

1. masks: 2 simulated nodes with gpus_per_node 1 (2 GPUs needed; 1 GPU: one node) each see
   their own CUDA_VISIBLE_DEVICES, and torch in the rank sees exactly 1 device;
2. sampling: a rank that keeps GPU 0 busy (matmuls) for `--busy` seconds: `treb status
   --json` lists the node's GPUs with utilisation above 5% on the busy one, and
   `treb metrics` has the `gpu.util.n0.g<i>` / `gpu.mem.n0.g<i>` series;
3. idle: `sleep` with `idle_gpu_timeout: 10s`, `idle_gpu_action: fail` ends FAILED with
   the attempt's reason idle_gpu, well before the sleep's end;
4. an OOM's diagnosis: a rank that allocates more than the GPU holds fails, and `treb
   diagnose --json` says gpu_oom.
Each prints PASS or FAIL with what it saw; the exit code is the number of failures.
Usage (from the repo, its venv active, on the GPU machine): python bench/gpu_check.py [--busy 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAILED: list[str] = []


def treb(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def check(name: str, ok: bool, saw: object) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {saw}")
    if not ok:
        FAILED.append(name)


def spec(folder: Path, name: str, text: str) -> str:
    path = folder / f"{name}.yaml"
    path.write_text(f"name: {name}\n{text}")
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy", type=float, default=20.0)
    args = ap.parse_args()
    from trebuchet.envs.gpus import detect

    vendor, devices = detect()
    if not devices:
        print(f"no GPU found (vendor {vendor}): this script is for a machine with one")
        return 1
    print(f"{vendor}: {len(devices)} GPU(s)")
    work = Path(tempfile.mkdtemp(prefix="treb-gpu-check-"))
    nodes = min(2, len(devices))
    probe = (
        "python -c \"import os, torch; print(os.environ.get('CUDA_VISIBLE_DEVICES'), "
        "os.environ.get('HIP_VISIBLE_DEVICES'), torch.cuda.device_count())\""
    )
    res = treb("run", spec(work, "masks", f"nodes: {nodes}\ngpus_per_node: 1\n"
                           f"command: {json.dumps(probe)}\n"))  # fmt: skip
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[")]
    masks = {ln.split()[1] if ln.split()[1] != "None" else ln.split()[2] for ln in lines}
    check("masks", res.returncode == 0 and len(masks) == nodes
          and all(ln.split()[-1] == "1" for ln in lines), lines)  # fmt: skip

    busy = (
        "python -c \"import time, torch; x = torch.randn(4096, 4096, device='cuda'); "
        f"t = time.time()\nwhile time.time() - t < {args.busy}: y = x @ x\n"
        'torch.cuda.synchronize()"'
    )
    res = treb("run", "-d", spec(work, "busy", f"gpus_per_node: 1\ncommand: {json.dumps(busy)}\n"))
    run = res.stdout.split()[0] if res.returncode == 0 else ""
    seen: list = []
    end = time.monotonic() + args.busy + 30
    while run and time.monotonic() < end:
        st = json.loads(treb("status", run, "--json").stdout)
        seen = st.get("gpus") or []
        if any((g.get("util") or 0) > 5 for g in seen) or st["state"] not in ("PENDING", "RUNNING"):
            break
        time.sleep(2)
    check("sampling: a busy GPU", any((g.get("util") or 0) > 5 for g in seen), seen)
    if run:
        treb("cancel", run)
        names = list(json.loads(treb("metrics", run, "--json").stdout).get("metrics", {}))
        check("sampling: metrics", any(n.startswith("gpu.util.n0.g") for n in names)
              and any(n.startswith("gpu.mem.n0.g") for n in names), names)  # fmt: skip

    t0 = time.monotonic()
    res = treb("run", spec(work, "idle", "gpus_per_node: 1\ncommand: sleep 120\n"
                           "idle_gpu_timeout: 10s\nidle_gpu_action: fail\n"))  # fmt: skip
    st = json.loads(treb("status", "--json").stdout)
    reason = (st.get("attempts") or [{}])[-1].get("reason")
    check("idle GPUs fail the run", st["state"] == "FAILED" and reason == "idle_gpu"
          and time.monotonic() - t0 < 100, (st["state"], reason))  # fmt: skip

    oom = (
        'python -c "import torch; free, total = torch.cuda.mem_get_info(); '
        "x = torch.empty(int(total * 2), dtype=torch.uint8, device='cuda')\""
    )
    res = treb("run", spec(work, "oom", f"gpus_per_node: 1\ncommand: {json.dumps(oom)}\n"))
    diag = json.loads(treb("diagnose", "--json").stdout or "{}")
    cat = (diag.get("root_cause") or {}).get("category")
    check("an OOM's diagnosis", res.returncode == 1 and cat == "gpu_oom", cat)
    print(f"{len(FAILED)} failed" + (f": {', '.join(FAILED)}" if FAILED else ""))
    return len(FAILED)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
