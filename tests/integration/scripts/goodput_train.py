"""A scripted CPU training (gloo) with known losses, for the goodput tests: every rank
allreduces a loss each step (STEP_S apart), rank 0 checkpoints every 10 steps (a file in
TREB_CHECKPOINT_DIR, then a checkpoint mark); attempts resume from the last checkpoint.
Rank 1 kills itself once, at step KILL_AT of the first attempt. Every rank writes its own
clock (the truth the accounting is checked against) to $CLOCK_DIR/clock-<attempt>-<rank>:
`<time> <what> <step>` lines (start, step, checkpoint, kill, signal)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ["GOODPUT_SRC"])
from trebuchet.dist import mark  # noqa: E402

STEPS = int(os.environ.get("STEPS", "50"))
STEP_S = float(os.environ.get("STEP_S", "0.2"))
KILL_AT = int(os.environ.get("KILL_AT", "25"))
EVERY = 10
rank, attempt = int(os.environ["RANK"]), int(os.environ["TREB_ATTEMPT"])
ckpt_dir = os.environ["TREB_CHECKPOINT_DIR"]
clock = open(os.path.join(os.environ["CLOCK_DIR"], f"clock-{attempt}-{rank}"), "a")  # noqa: SIM115 (open for the process's life)


def note(what: str, step: int) -> None:
    clock.write(f"{time.time():.6f} {what} {step}\n")
    clock.flush()


def on_signal() -> None:
    """The checkpoint signal (the hang acted on) seen at once, while the main thread waits
    in gloo: the C handler writes to the wakeup fd, this thread reads it."""
    while os.read(r, 1):
        note("signal", -1)


note("start", 0)
r, w_fd = os.pipe()
os.set_blocking(w_fd, False)
signal.signal(signal.SIGUSR2, lambda *_: None)
signal.set_wakeup_fd(w_fd, warn_on_full_buffer=False)
threading.Thread(target=on_signal, daemon=True).start()
dist.init_process_group("gloo")
saved = sorted(
    int(n[5:-3]) for n in os.listdir(ckpt_dir) if n.startswith("ckpt-") and n.endswith(".pt")
)
step = saved[-1] if saved else 0
w = torch.load(os.path.join(ckpt_dir, f"ckpt-{step}.pt")) if saved else torch.zeros(1)
while step < STEPS:
    time.sleep(STEP_S)
    loss = torch.tensor([1.0 / (step + 1)])
    dist.all_reduce(loss)
    w += loss
    step += 1
    note("step", step)
    mark("step", step)
    print(f"step={step} loss={loss.item():.4f}", flush=True)
    if step % EVERY == 0 and rank == 0:
        tmp = os.path.join(ckpt_dir, f".ckpt-{step}.tmp")
        torch.save(w, tmp)
        os.replace(tmp, os.path.join(ckpt_dir, f"ckpt-{step}.pt"))
        note("checkpoint", step)
        mark("checkpoint", step)
    if attempt == 0 and rank == 1 and step == KILL_AT:
        note("kill", step)
        os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
dist.destroy_process_group()
