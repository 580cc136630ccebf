"""Tiny torch.distributed (gloo) check: every rank all-reduces rank+1 and prints the sum.

Run under torchrun on each node of the test cluster (see smoke.sh). Also prints the
address the node's hostname resolves to, which is what gloo binds to when
GLOO_SOCKET_IFNAME is unset: it must be the node's address, not 127.0.x.
"""

import os
import socket
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
host = socket.gethostname()
expect = world * (world + 1) / 2
# One write per line: the two local ranks share srun's pipe.
sys.stdout.write(
    f"rank {rank}/{world} host {host} addr {socket.gethostbyname(host)} "
    f"local_rank {os.environ.get('LOCAL_RANK')} all_reduce {t.item():g} "
    f"{'OK' if t.item() == expect else f'WRONG expected {expect:g}'}\n"
)
sys.stdout.flush()
dist.destroy_process_group()
if t.item() != expect:
    raise SystemExit(1)
