"""An Accelerate loop as its examples write it (test helper): `Accelerator.log` with no
tracker configured (it prints nothing: no tracker, no output), paired with what users print
beside it: `accelerator.print(f"epoch {epoch}:", metrics)` (the examples' own line) and a
dict with its step every few steps. CPU, the ranks treb's (gloo).
Argument: STEPS.
"""

import sys

import torch
from accelerate import Accelerator


def main() -> None:
    steps = int(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    step = 0
    for epoch in range(100):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            step += 1
            values = {"train_loss": loss.item(), "lr": opt.param_groups[0]["lr"]}
            accelerator.log(values, step=step)
            if step % 5 == 0:
                accelerator.print({"step": step, **values})
            if step == steps:
                accelerator.print(f"epoch {epoch}:", {"loss": round(loss.item(), 4)})
                # The DDP model freed before end_training() destroys the process group:
                # alive to the interpreter's end, torch 2.13's gloo threads abort it
                # (`terminate called without an active exception`, 1 run in 5 here).
                del loss
                model, opt, loader = accelerator.free_memory(model, opt, loader)
                accelerator.end_training()
                return
        accelerator.print(f"epoch {epoch}:", {"loss": round(loss.item(), 4)})


if __name__ == "__main__":
    main()
