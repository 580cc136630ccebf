"""A training loop that checkpoints every step (test helper for node loss, issue 23).

Every rank joins a gloo group over env:// and all-reduces once a step; rank 0 writes
$TREB_CHECKPOINT_DIR/ckpt.json (the step, then renamed) after each. At start each rank
resumes from the checkpoint there and says so in start-<attempt>-<rank>.json beside it:
its host, NODE_RANK, WORLD_SIZE, MASTER_ADDR and the step it resumed from.
"""

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
STEP_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3


def write(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as fh:
        json.dump(data, fh)
    os.replace(path + ".tmp", path)


def main() -> None:
    ckpt_dir = os.environ["TREB_CHECKPOINT_DIR"]
    os.makedirs(ckpt_dir, exist_ok=True)
    ckpt = os.path.join(ckpt_dir, "ckpt.json")
    start = 0
    if os.path.exists(ckpt):
        with open(ckpt) as fh:
            start = json.load(fh)["step"] + 1
    rank, attempt = int(os.environ["RANK"]), os.environ.get("TREB_ATTEMPT", "0")
    dist.init_process_group("gloo", init_method="env://")
    write(os.path.join(ckpt_dir, f"start-{attempt}-{rank}.json"), {
        "host": socket.gethostname(), "node_rank": int(os.environ["NODE_RANK"]),
        "world": dist.get_world_size(), "env_world": int(os.environ["WORLD_SIZE"]),
        "master": os.environ["MASTER_ADDR"], "resumed_from": start,
    })  # fmt: skip
    print(f"rank {rank}: attempt {attempt}, world {dist.get_world_size()}, from step {start}",
          flush=True)  # fmt: skip
    for step in range(start, STEPS):
        t = torch.ones(1)
        dist.all_reduce(t)
        if rank == 0:
            write(ckpt, {"step": step, "world": int(t.item())})
        print(f"step {step}/{STEPS}", flush=True)
        time.sleep(STEP_S)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
