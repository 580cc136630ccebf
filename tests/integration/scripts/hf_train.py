"""A HuggingFace Trainer run as users write it (test helper): a 2-layer GPT-2 built from
its config (n_embd 32: no model hub here), random tokens, CPU, the ranks torch's
(`treb run -n 2` gives RANK/WORLD_SIZE/MASTER_*; the Trainer starts gloo on CPU).

Arguments: `STEPS [--no-tqdm] [--save N] [--sleep S] [--die-at N] [--hang-at N]`: max_steps;
the Trainer's bars off (`disable_tqdm=True`, common on clusters, with `log_level="info"`:
the log then holds `Total optimization steps = N` and a dict every `logging_steps`); a
checkpoint every N steps (its shard writer draws a bar of its own); a pause per step (a
slow run, so progress can be sampled midway); rank 0 of the first attempt exits 1, or stops
for good, at step N (a later attempt resumes from the last checkpoint).
"""

import argparse
import os
import sys
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 16, vocab: int = 128) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Slow(TrainerCallback):
    def __init__(self, seconds: float, die_at: int, hang_at: int) -> None:
        self.seconds, self.die_at, self.hang_at = seconds, die_at, hang_at
        self.first = os.environ.get("TREB_ATTEMPT", "0") == "0" and os.environ.get("RANK") == "0"

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201, ARG002
        time.sleep(self.seconds)
        if self.first and state.global_step == self.die_at:
            os._exit(1)
        if self.first and state.global_step == self.hang_at:
            time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("--no-tqdm", action="store_true")
    p.add_argument("--save", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=-1)
    a = p.parse_args()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    args = TrainingArguments(
        output_dir=os.environ.get("TREB_CHECKPOINT_DIR", "out"), max_steps=a.steps,
        per_device_train_batch_size=4, learning_rate=5e-4, logging_steps=5, report_to=[],
        save_strategy="steps" if a.save else "no", save_steps=a.save or 500,
        disable_tqdm=a.no_tqdm, log_level="info" if a.no_tqdm else "passive", use_cpu=True,
        dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    trainer = Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=Tokens(4096),
                      callbacks=[Slow(a.sleep, a.die_at, a.hang_at)])  # fmt: skip
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    # torch 2.13 aborts some runs in the interpreter's shutdown when the process group was
    # never destroyed (`terminate called without an active exception`, SIGABRT, under torchrun
    # too; the Trainer does not destroy it): treb names that `exit_abort`
    # (tests/integration/test_exit_abort.py). These tests are about what treb reads from the
    # Trainer, so the finished program leaves without the shutdown that may abort. Calling
    # destroy_process_group() instead made the two-node Slurm variant hang at exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
