"""The nodes' health checks' cost per attempt (runtime/node/health.py; issue 23: well under a
second). Each node runs them at once before its ranks, so an attempt pays one node's time.

Measured here, per node: the built-in checks (runtime, disk, shared, master) through
`health.gate` as an agent calls it (records written and renamed included), then with a
trivial spec `health_check: "true"` (a bash start), then with the GPU check against a
STAND-IN `nvidia-smi` (no GPU here: a shell script listing 8 GPUs; a real nvidia-smi -L
takes what the driver takes, ~0.05-0.1 s on a loaded node: bench/gpu_check.py's machine).

Usage: python bench/health_cost.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trebuchet.runtime.node import health  # noqa: E402

SMI = "#!/bin/sh\n# STAND-IN nvidia-smi (bench/health_cost.py)\n" + "".join(
    f'echo "GPU {i}: NVIDIA H100 (UUID: GPU-{i})"\n' for i in range(8)
)


def run(repeat: int, conf: dict, env: dict[str, str], root: Path, tag: str) -> list[float]:
    times = []
    for i in range(repeat):
        run_dir = root / f"run-{tag}-{i}"
        adir = run_dir / "attempt-0"
        adir.mkdir(parents=True)
        where = health.Where(str(run_dir), str(adir), 0, 0, "node-0", str(root), env)
        t0 = time.perf_counter()
        assert health.gate(where, conf) is None, (adir / "health-0.json").read_text()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as port:
        root = Path(tmp)
        port.bind(("127.0.0.1", 0))  # bound, not listening: as before rank 0 starts
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").write_text(SMI)
        (bin_dir / "nvidia-smi").chmod(0o755)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port.getsockname()[1])}
        gpu_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}
        for what, conf, e in (
            ("built-in checks", {}, env),
            ("built-in + health_check: true", {"health_check": "true"}, env),
            ("built-in + gpus (stand-in nvidia-smi, 8 GPUs)", {"gpus_per_node": 8}, gpu_env),
        ):
            os.environ["PATH"] = e["PATH"]  # the GPU check runs nvidia-smi from PATH
            t = run(args.repeat, conf, e, root, str(len(what)))
            print(f"{what:<48} median {statistics.median(t) * 1000:6.1f} ms, "
                  f"max {max(t) * 1000:6.1f} ms ({args.repeat} runs)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
