"""A real horovod.torch training for `launcher: horovod` (tests/integration/test_horovod.py).

A small linear model, broadcast from rank 0, trained with hvd.DistributedOptimizer on data
that differs per rank; then the weights and an allreduce checked equal on every rank, and
the rank contract (trebuchet.dist.init_env) checked against horovod's own view. Prints
`HVD OK rank=R size=S host=H w=...` on success; any mismatch raises (the rank fails).
`HVD_FAIL_RANK=r`: that rank exits 3 after the first step (a failing rank).
`HVD_QUOTE_SHUTDOWN=1`: the failing rank prints horovod's shutdown text before it exits (a
program's own words: no cascade, it stays the first failure).
`HVD_SLOW_EXIT=S`: the failing rank's exit takes S seconds after horovod's own shutdown (a
program whose atexit work is slow: its peers fail on horovod's shutdown and horovodrun
stops it, SIGTERM, before its exit ends, as a loaded machine does to a plain sys.exit).
"""

import os
import socket
import sys
import time

import horovod.torch as hvd
import torch

from trebuchet.dist import init_env

hvd.init()
init_env()  # under treb the contract is set already: it must agree with horovod's view
rank, size = hvd.rank(), hvd.size()
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "NUM_NODES")
seen = tuple(int(os.environ[n]) for n in names)
assert seen[:2] == (rank, size), (seen, rank, size)
ppn = seen[3]
assert seen[2:] == (rank % ppn, ppn, rank // ppn, size // ppn), seen
if hvd.cross_size() == seen[5]:  # real hosts (simulated nodes share one: horovod sees one)
    assert (hvd.local_rank(), hvd.local_size(), hvd.cross_rank()) == (seen[2], ppn, seen[4])
torch.manual_seed(1234 + rank)  # different initial weights: the broadcast must fix them
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
x = torch.randn(16, 4)  # per rank (seeded by rank)
y = x.sum(dim=1, keepdim=True)
fail = os.environ.get("HVD_FAIL_RANK")
for step in range(5):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step + 1}/5 loss={loss.item():.4f}", flush=True)
    if fail is not None and int(fail) == rank:
        if os.environ.get("HVD_QUOTE_SHUTDOWN"):  # its own words quote horovod's cascade
            print("hint: 'Horovod has been shut down. This was caused by an exception on one "
                  "of the ranks' in a log is a peer's failure", file=sys.stderr)  # fmt: skip
        print(f"rank {rank} failing on purpose on {socket.gethostname()}", file=sys.stderr)
        if os.environ.get("HVD_SLOW_EXIT"):  # horovod's shutdown, then the rest of the exit
            hvd.shutdown()
            time.sleep(float(os.environ["HVD_SLOW_EXIT"]))
        sys.exit(3)
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = hvd.allgather(flat.unsqueeze(0), name="weights")
assert all(torch.equal(gathered[0], row) for row in gathered), gathered
total = hvd.allreduce(torch.tensor([float(rank + 1)]), op=hvd.Sum, name="ranks")
assert total.item() == size * (size + 1) / 2, total
print(f"HVD OK rank={rank} size={size} host={socket.gethostname()} "
      f"controller={'mpi' if hvd.mpi_enabled() else 'gloo'} w={flat[0].item():.6f} "
      f"iface={os.environ.get('HOROVOD_GLOO_IFACE', '-')}", flush=True)  # fmt: skip
