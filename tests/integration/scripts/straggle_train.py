"""Lockstep training with one slow rank (gloo all-reduce each step): `STEPS BASE_S SLOW
FACTOR WAIT [SAVE_AT EXIT]`. Each rank "computes" for BASE_S seconds (rank SLOW for FACTOR times that),
marks its arrival (`trebuchet.dist.mark("compute", n)`), joins the all-reduce and marks the
step. With WAIT=1, once its steps are done rank 0 waits (at most 120 s) for the run's
`straggler` event and exits 3 without one: the straggler was named within STEPS steps,
whatever the machine's pace, with no clock in the test. SAVE_AT: rank 0 prints the
HuggingFace Trainer's line for a checkpoint at that step (and writes none: the line alone
says it); EXIT: the ranks' exit code at the end (a failure after the checkpoint)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from trebuchet.dist import mark

steps, base, slow, factor, wait = (int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]),
                                   float(sys.argv[4]), sys.argv[5] == "1")  # fmt: skip
save_at, status = (int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else (-1, 0)
dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(16)
for n in range(steps):
    time.sleep(base * (factor if rank == slow else 1.0))  # the rank's own work
    mark("compute", n)  # arrived at the collective
    dist.all_reduce(grad)
    mark("step", n)
    if n == save_at and rank == 0:
        folder = os.environ["TREB_CHECKPOINT_DIR"]
        print(f"Saving model checkpoint to {folder}/checkpoint-{n}", flush=True)
print(f"rank {rank}: {steps} steps", flush=True)


def named() -> bool:
    try:
        with open(os.path.join(os.environ["TREB_RUN_DIR"], "events.jsonl")) as fh:
            return any(json.loads(x).get("event") == "straggler" for x in fh if x.strip())
    except OSError:
        return False


code = status
if wait and rank == 0:
    deadline = time.monotonic() + 120
    while not named() and time.monotonic() < deadline:
        time.sleep(0.1)
    code = 0 if named() else 3
    print("straggler named" if code == 0 else "no straggler event", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(code)
