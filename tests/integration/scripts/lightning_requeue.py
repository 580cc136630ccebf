"""A Lightning CPU DDP Trainer (2 ranks, gloo) left with Lightning's own SLURM auto-requeue
(test helper): on SIGUSR1 it saves `hpc_ckpt_<n>.ckpt` in default_root_dir and rank 0 runs
`scontrol requeue $SLURM_JOB_ID`; a requeued job resumes from that checkpoint by itself.

The first attempt trains slowly (a second per step), so the checkpoint signal before the
time limit finds it mid-training; a later attempt trains at full speed and ends.
"""

import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, _index):  # noqa: ANN001, ANN201
        x, y = batch
        if os.environ.get("TREB_ATTEMPT") == "0":
            time.sleep(1.0)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:  # after a checkpoint is restored (not on_fit_start)
        env = type(self.trainer.strategy.cluster_environment).__name__
        print(f"rank {self.global_rank} attempt {os.environ.get('TREB_ATTEMPT')}: {env}, "
              f"starts at step {self.trainer.global_step} from {self.trainer.ckpt_path}",
              flush=True)  # fmt: skip

    def on_fit_end(self) -> None:
        print(f"rank {self.global_rank} done at step {self.trainer.global_step}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        num_nodes=int(os.environ.get("NUM_NODES", "1")), strategy="ddp", max_epochs=40,
        default_root_dir=os.environ["TREB_CHECKPOINT_DIR"], enable_progress_bar=False,
        enable_checkpointing=False, logger=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Model(), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
