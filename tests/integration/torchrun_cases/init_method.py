"""init_process_group with --init-method (tcp:// or env://), one all-reduce, exit 0."""

import argparse
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--init-method", required=True)
method = p.parse_args().init_method
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=method, rank=rank, world_size=world)
t = torch.tensor([1.0])
dist.all_reduce(t)
assert t.item() == world, t
dist.destroy_process_group()
