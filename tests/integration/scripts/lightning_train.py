"""A Lightning Trainer with its progress bar (test helper): CPU DDP over gloo, the ranks
treb's (`treb run -n 2`: Lightning reads RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*), a metric
logged with `prog_bar=True`, so the bar carries it: `Epoch 1: 50%|.| 4/8 [.., train_loss=1.23]`.
A validation loop draws a bar of its own, which is not the run's progress.
Arguments: EPOCHS [SLEEP] [BAR]: the epochs, a pause per batch, `tqdm` for Lightning's
TQDMProgressBar (its default is the RichProgressBar when rich is installed, which draws
nothing into a log until it ends).
"""

import os
import sys
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, pause: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.pause = pause

    def training_step(self, batch, _index):  # noqa: ANN001, ANN201
        x, y = batch
        time.sleep(self.pause)
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _index):  # noqa: ANN001, ANN201
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), prog_bar=True)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    trainer = L.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        num_nodes=int(os.environ.get("NUM_NODES", "1")), strategy="ddp",
        max_epochs=int(sys.argv[1]), logger=False, enable_checkpointing=False,
        enable_model_summary=False, log_every_n_steps=1,
        callbacks=[TQDMProgressBar()] if sys.argv[3:] == ["tqdm"] else None,
    )  # fmt: skip
    pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    trainer.fit(Model(pause), DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))


if __name__ == "__main__":
    main()
