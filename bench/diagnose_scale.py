"""Diagnosis at scale: a 2 GB directory of 256 rank logs, diagnosed in seconds.

Writes --ranks logs of --size-mb each into a temporary directory: timestamped training
output with the usual noise (NCCL INFO lines, warnings), a handled traceback near the top
of rank 0's log, and at the end the story of a real incident: rank 137 hits CUDA out of
memory; ten minutes later every other rank reports an NCCL watchdog timeout and aborts,
and is SIGTERMed in the cascade. Then times `treb diagnose DIR --json` twice: with the logs
dropped from the page cache (posix_fadvise DONTNEED after fsync: read from disk) and with
them cached. The diagnosis must name rank 137 and gpu_oom.
--layout merged writes one console log of the same size instead (every line `[rankN]:`).
Usage: python bench/diagnose_scale.py [--ranks 256] [--size-mb 8] [--layout per-rank|merged]
       [--dir D] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

OLD_ERROR = (
    b'Traceback (most recent call last):\n  File "/workspace/data.py", line 9, in '
    b"<module>\nFileNotFoundError: cache.idx (rebuilding it)\n"
)


def root_rank(ranks: int) -> int:
    return ranks * 137 // 256  # rank 137 of 256


T0 = time.mktime((2026, 3, 14, 9, 26, 53, 0, 0, -1))


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"


def noise_block(rank: int, size: int) -> bytes:
    """About `size` bytes of ordinary training output."""
    lines = []
    n = 0
    step = 0
    while n < size:
        t = T0 - 7200 + step * 0.35
        if step % 500 == 0:
            line = (f"node{rank // 8:03d}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO "
                    f"Channel {step % 32:02d}/32 : {rank} -> {rank + 1} via NET/IB/0")  # fmt: skip
        elif step % 997 == 0:
            line = (f"{stamp(t)} WARNING torch/utils/data/dataloader.py: This DataLoader will "
                    "create 8 worker processes in total.")  # fmt: skip
        else:
            norm = 1.0 + (step % 7) / 10
            line = (f"{stamp(t)} INFO trainer: step {step} loss {2.5 - step * 1e-5:.4f} lr "
                    f"3.0e-4 grad_norm {norm:.2f} tokens/s {118000 + step % 911}")  # fmt: skip
        lines.append(line)
        n += len(line) + 1
        step += 1
    return ("\n".join(lines) + "\n").encode()


def oom_tail(rank: int) -> str:
    t = T0
    return (
        f"{stamp(t)} INFO trainer: step 20571 loss 1.9876\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 211, in <module>\n    main()\n'
        '  File "/workspace/train.py", line 187, in main\n    loss = step(model, batch)\n'
        '  File "/workspace/train.py", line 142, in step\n    out = model(batch["input_ids"])\n'
        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1773,'
        " in _wrapped_call_impl\n    return self._call_impl(*args, **kwargs)\n"
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.91 GiB. GPU {rank % 8} "
        "has a total capacity of 79.10 GiB of which 2.11 GiB is free. Of the allocated memory "
        "74.02 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.\n"
    )


def victim_tail(rank: int) -> str:
    t = T0 + 600.02 + rank * 0.001
    g = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1e6) % 1000000:06d}"
    frames = "".join(f"frame #{i}: <unknown function> + 0x{4096 + 37 * i:x} (0x7f00{i:08x} in "
                     "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)\n"
                     for i in range(24))  # fmt: skip
    return (
        f"[rank{rank}]:[E{g} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=41230, OpType=ALLREDUCE, NumelIn=1048576, "
        "NumelOut=1048576, Timeout(ms)=600000) ran for 600018 milliseconds before timing out.\n"
        f"[rank{rank}]:[E{g} ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank "
        f"{rank}] Exception (either an error or timeout) detected by watchdog at work: 41230, "
        "last enqueued NCCL work: 41230, last completed NCCL work: 41229.\n"
        f"[rank{rank}]:[E{g} ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL operations have "
        "failed or timed out. To avoid data inconsistency, we are taking the entire process down.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  [PG ID 0 PG GUID 0(default_pg) Rank {rank}] Process group watchdog thread "
        "terminated with exception: Watchdog caught collective operation timeout\n" + frames +
        "Fatal Python error: Aborted\n\nThread 0x00007f1234567700 (most recent call first):\n"
        '  File "/workspace/train.py", line 187 in main\n'
    )  # fmt: skip


def write_logs(root: Path, ranks: int, size: int) -> int:
    total = 0
    for rank in range(ranks):
        tail = (oom_tail(rank) if rank == root_rank(ranks) else victim_tail(rank)).encode()
        block = noise_block(rank, 1 << 20)
        path = root / f"rank-{rank:03d}.log"
        with open(path, "wb") as fh:
            if rank == 0:  # an old, handled error near the top
                fh.write(OLD_ERROR)
            written = 0
            while written + len(block) + len(tail) <= size:
                fh.write(block)
                written += len(block)
            fh.write(block[: max(0, size - written - len(tail))])
            fh.write(tail)
            fh.flush()
            os.fsync(fh.fileno())
        total += path.stat().st_size
    return total


def write_merged(root: Path, ranks: int, size: int) -> int:
    """One console log of the whole job (as srun or torchrun --tee writes it): every line
    tagged `[rankN]:`, the same incident at its end."""
    path = root / "job.log"
    blocks = [noise_block(r, 64 << 10) for r in range(ranks)]
    tagged = [b"".join(f"[rank{r}]: ".encode() + ln + b"\n" for ln in blk.splitlines())
              for r, blk in enumerate(blocks)]  # fmt: skip
    oom = "".join(f"[rank{root_rank(ranks)}]: {ln}\n"
                  for ln in oom_tail(root_rank(ranks)).splitlines()).encode()  # fmt: skip
    victims = "".join(victim_tail(r) for r in range(ranks) if r != root_rank(ranks)).encode()
    with open(path, "wb") as fh:
        written, i = 0, 0
        while written < size * ranks - len(oom) - len(victims):
            fh.write(tagged[i % ranks])
            written += len(tagged[i % ranks])
            i += 1
        fh.write(oom + victims)
        fh.flush()
        os.fsync(fh.fileno())
    return path.stat().st_size


def drop_cache(root: Path) -> None:
    for p in root.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def diagnose(root: Path) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", str(root), "--json"],
                         capture_output=True, text=True)  # fmt: skip
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"treb diagnose failed: {res.stderr[-2000:]}")
    return elapsed, json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--size-mb", type=float, default=8.0, help="per rank log (8 x 256 = 2 GiB)")
    ap.add_argument("--dir", help="parent directory for the logs (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the logs behind")
    ap.add_argument("--layout", choices=["per-rank", "merged"], default="per-rank",
                    help="a directory of rank logs, or one console log as big")  # fmt: skip
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="treb-diag-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        size = int(args.size_mb * (1 << 20))
        merged = args.layout == "merged"
        write = write_merged if merged else write_logs
        total = write(root, args.ranks, size)
        what = f"1 console log of {args.ranks} ranks" if merged else f"{args.ranks} rank logs"
        print(f"wrote {what}, {total / (1 << 30):.2f} GiB, in "
              f"{time.perf_counter() - t0:.1f}s ({root})")  # fmt: skip
        drop_cache(root)
        target = root / "job.log" if merged else root
        cold, data = diagnose(target)
        warm, _ = diagnose(target)
        root_cause = data["root_cause"]
        ok = (root_cause["category"], root_cause["rank"]) == ("gpu_oom", root_rank(args.ranks))
        print(f"machine: {machine()}")
        print(f"treb diagnose {what} ({total / (1 << 30):.2f} GiB): "
              f"{cold:.2f}s from disk (page cache dropped), {warm:.2f}s cached")  # fmt: skip
        print(f"root cause: {root_cause['category']} on rank {root_cause['rank']}: "
              f"{root_cause['summary'][:120]}")  # fmt: skip
        if not ok:
            raise SystemExit(f"wrong diagnosis: expected gpu_oom on rank {root_rank(args.ranks)}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
