"""Data-parallel training of a small MLP on scikit-learn's bundled digits (no download).

Why this example: it is a real torch.distributed job that finishes in seconds on a laptop CPU,
so it exercises launchers end to end (rendezvous, per-rank env, checkpoint/resume, metrics).
It runs under torchrun or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT (env:// init); started alone it runs as a single rank.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEED = 0
CKPT_NAME = "digits-ddp.pt"


def setup(cpu: bool) -> tuple[int, int, torch.device]:
    """Join the process group; defaults make a plain `python train.py` a 1-rank job."""
    with contextlib.suppress(ImportError):  # srun/mpirun/SkyPilot vars -> RANK etc.
        from trebuchet.dist import init_env  # optional: only where trebuchet is installed

        init_env()
    if "RANK" not in os.environ:  # not started by a launcher: be a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # OMP_NUM_THREADS (set by trebuchet and torchrun) wins; otherwise share the cores.
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    threads = int(os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // local_world))
    torch.set_num_threads(max(1, threads))
    # nccl needs a GPU per local rank (cuda:LOCAL_RANK); every rank must pick the same backend.
    gpus = 0 if cpu else torch.cuda.device_count()
    if 0 < gpus < local_world and local_rank == 0:
        print(f"{gpus} GPU(s) for {local_world} local ranks: training on CPU", flush=True)
    if gpus >= local_world:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method="env://", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method="env://")
    return dist.get_rank(), dist.get_world_size(), device


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """Same stratified 80/20 split on every rank, standardised on the training part only."""
    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=SEED, stratify=y)
    scaler = StandardScaler().fit(x_tr)

    def ds(xs: np.ndarray, ys: np.ndarray) -> TensorDataset:
        return TensorDataset(
            torch.tensor(scaler.transform(xs), dtype=torch.float32),
            torch.tensor(ys, dtype=torch.long),
        )

    return ds(x_tr, y_tr), ds(x_te, y_te)


def load_checkpoint(
    path: Path | None, model: nn.Module, opt: torch.optim.Optimizer, device: torch.device
) -> int:
    """Resume after a retry: returns the number of epochs already done (0 without one)."""
    if path is None or not path.exists():
        return 0
    state = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    print(f"resumed from epoch {state['epoch']}", flush=True)
    return int(state["epoch"])


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, epoch: int) -> None:
    """Write to a temp file then rename, so a crash mid-write never leaves a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU even with GPUs")
    parser.add_argument(
        "--crash-after-epoch", type=int, default=0, metavar="N",
        help="fault drill: on the first attempt (TREB_ATTEMPT=0) the last rank exits with "
        "code 1 once epoch N is checkpointed, so a retry can resume from it",
    )  # fmt: skip
    args = parser.parse_args()

    rank, world, device = setup(args.cpu)
    torch.manual_seed(SEED)
    train_ds, test_ds = load_data()
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ckpt_dir = os.environ.get("TREB_CHECKPOINT_DIR")
    ckpt = Path(ckpt_dir) / CKPT_NAME if ckpt_dir else None
    start = load_checkpoint(ckpt, model, opt, device)
    # Every rank must resume from the same epoch, or the collectives below would deadlock.
    bounds = torch.tensor([start, -start], device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    if bounds[0].item() != -bounds[1].item():
        raise RuntimeError(f"ranks disagree on the resume epoch (is {ckpt_dir} shared?)")
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = nn.CrossEntropyLoss()

    samples, train_time = 0, 0.0
    for epoch in range(start + 1, args.epochs + 1):
        drill = args.crash_after_epoch and epoch == args.crash_after_epoch + 1
        if drill and os.environ.get("TREB_ATTEMPT", "0") == "0":
            dist.barrier()  # rank 0 has written the checkpoint of the previous epoch
            if rank == world - 1:
                print(f"simulated crash after epoch {args.crash_after_epoch}", flush=True)
                os._exit(1)
        sampler.set_epoch(epoch)
        ddp.train()
        stats = torch.zeros(2, device=device)  # sum of per-sample loss, samples
        t0 = time.perf_counter()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            stats[0] += loss.detach() * len(yb)
            stats[1] += len(yb)
        if device.type == "cuda":
            torch.cuda.synchronize()
        train_time += time.perf_counter() - t0
        dist.all_reduce(stats)
        samples += int(stats[1].item())
        if rank == 0:
            print(f"epoch {epoch} loss {(stats[0] / stats[1]).item():.4f}", flush=True)
            if ckpt is not None:
                save_checkpoint(ckpt, model, opt, epoch)

    # Throughput is bounded by the slowest rank: divide all ranks' samples by its time.
    slowest = torch.tensor([train_time], device=device, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        model.eval()
        with torch.no_grad():
            x_te, y_te = (t.to(device) for t in test_ds.tensors)
            accuracy = (model(x_te).argmax(1) == y_te).float().mean().item()
        print(f"accuracy: {accuracy:.4f}", flush=True)
        if samples:  # nothing trained (resumed a finished run): no rate to report
            print(f"performance: {samples / slowest.item():.1f} samples_per_second", flush=True)
    # Every rank leaves together, with DDP's gloo work objects freed while the interpreter
    # is whole. Even so, torch's gloo backend can abort in interpreter finalization
    # ("terminate called without an active exception"; pytorch/pytorch#179291 describes
    # the cause): all is done, printed and checkpointed by now, so leave without it.
    del ddp
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
