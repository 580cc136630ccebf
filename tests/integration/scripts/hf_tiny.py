"""The HuggingFace Trainer as users run it (transformers 5.x, accelerate): a 2-layer GPT-2
built from its config (n_embd 32, no hub access), random tokens, CPU, gloo, only the
Trainer's own output (rank 0 prints, rank 1 does not). For the hang tests: attempt 0 runs
for minutes (`treb fault RUN hang-rank 0` stops it) and leaves `ready-<rank>` in the run
dir at step 50; a retry runs a few steps and ends.

HF_HANG_SLEEP=1: rank 0 sleeps in a callback at step 60 (a hang inside the training step,
read by py-spy without a SIGSTOP). Rank 0 beats while transformers imports (slow on a loaded
machine): that keeps a short hang_timeout counting from the hang itself."""

import os
import threading
import time

from trebuchet.dist import heartbeat

STARTED = threading.Event()


def beat_until_started() -> None:
    while not STARTED.wait(0.5):
        heartbeat()


if os.environ.get("RANK") == "0":  # rank 1 stays as silent as the Trainer keeps it
    threading.Thread(target=beat_until_started, daemon=True).start()

import torch  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

RUN_DIR = os.environ["TREB_RUN_DIR"]
ATTEMPT = int(os.environ.get("TREB_ATTEMPT", "0"))
RANK = int(os.environ.get("RANK", "0"))


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Marks(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if state.global_step == 3:
            STARTED.set()  # from here on, only the Trainer's output is progress
        if state.global_step == 50:
            open(os.path.join(RUN_DIR, f"ready-{RANK}"), "w").close()
        if state.global_step == 60 and RANK == 0 and os.environ.get("HF_HANG_SLEEP"):
            time.sleep(3600)  # HF-HANG-LINE


torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=16)
args = TrainingArguments(
    output_dir=os.path.join(RUN_DIR, "out"),
    per_device_train_batch_size=4,
    max_steps=20 if ATTEMPT else 100000,
    logging_steps=5,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    ddp_backend="gloo",
    dataloader_num_workers=0,
)
trainer = Trainer(
    model=GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens(4096), callbacks=[Marks()]
)
trainer.train()
