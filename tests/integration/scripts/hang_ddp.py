"""A DDP step where one rank is late: every rank but HANG_RANK enters an explicit
all_reduce while HANG_RANK sleeps (the hang), on attempt 0 only (a retry runs through).

HANG_UNTIL_HANG=1: the sleeping rank wakes once the launcher recorded the hang (on_hang:
warn goes on, so the run then ends). HANG_CKPT=1: the checkpoint signal leaves a marker
(`ckpt-rank-<r>` in the run dir). HANG_STACKS=1: faulthandler for stacks
(trebuchet.dist.enable_stacks()), for runs without py-spy.

Until every rank is ready, a thread beats (trebuchet.dist.heartbeat) so that importing torch
and joining the group, silent and slow on a loaded machine, are progress: the tests' short
hang_timeout then counts from the hang itself. It is stopped before anything else happens.
"""

import os
import signal
import threading
import time

from trebuchet.dist import heartbeat

STARTED = threading.Event()


def beat_until_started() -> None:
    heartbeat()
    while not STARTED.wait(0.5):
        heartbeat()


BEAT = threading.Thread(target=beat_until_started, daemon=True)
BEAT.start()

import torch  # noqa: E402 (after the heartbeat starts)
import torch.distributed as dist  # noqa: E402

RUN_DIR = os.environ["TREB_RUN_DIR"]
ATTEMPT = int(os.environ.get("TREB_ATTEMPT", "0"))


def on_checkpoint(signum, frame):
    with open(os.path.join(RUN_DIR, f"ckpt-rank-{os.environ['RANK']}"), "w") as fh:
        fh.write(f"attempt {ATTEMPT}\n")


def late_rank_waits():
    hang_json = os.path.join(RUN_DIR, f"attempt-{ATTEMPT}", "hang.json")
    deadline = time.time() + 600
    while time.time() < deadline:
        if os.environ.get("HANG_UNTIL_HANG") and os.path.exists(hang_json):
            return
        time.sleep(1)  # HANG-LINE


if os.environ.get("HANG_CKPT"):
    signal.signal(signal.SIGUSR2, on_checkpoint)
if os.environ.get("HANG_STACKS"):
    from trebuchet.dist import enable_stacks

    enable_stacks()
dist.init_process_group("gloo")
STARTED.set()
BEAT.join()
rank = dist.get_rank()
print(f"rank {rank} ready (attempt {ATTEMPT})", flush=True)
if rank == int(os.environ.get("HANG_RANK", "3")) and ATTEMPT == 0:
    late_rank_waits()
t = torch.ones(1)
dist.all_reduce(t)  # ALLREDUCE-LINE
print(f"rank {rank} all_reduce done: {t.item()}", flush=True)
dist.destroy_process_group()
