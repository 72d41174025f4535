"""An accelerate training loop that survives preemption, with relaunch's
tracker and preemption.

    relaunch run --nproc-per-node 2 examples/frameworks/accelerate_job.py --out /tmp/acc

Send the launcher SIGTERM (or Ctrl-C) while it trains: every rank stops
after the same step, ``accelerator.save_state`` writes that step (committed
atomically), the launcher exits 75. Run the same command again: the loop
loads it and skips the batches the epoch already trained. A tiny model on
synthetic data, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

from relaunch.integrations.accelerate import Preemption, RelaunchTracker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("accelerate-job"))
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    accelerator = Accelerator(
        cpu=True,
        log_with=[RelaunchTracker()],
        # The seedable sampler: a resumed epoch has the interrupted one's order.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    y = x @ torch.linspace(-1, 1, 16) + 0.1 * torch.randn(4096)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("accelerate-job", config={"lr": 0.01, "epochs": args.epochs})

    stop = Preemption(accelerator, args.out / "checkpoints")
    for epoch in stop.epochs(args.epochs):  # from where the newest checkpoint stopped
        for inputs, targets in stop.batches(loader):  # the epoch's batches not yet trained
            loss = torch.nn.functional.mse_loss(model(inputs).squeeze(-1), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=stop.step)
            if stop.reached():  # the agreed stop step: its state is saved
                sys.exit(0)
        accelerator.print(f"epoch {epoch}: loss {loss.item():.4f}")
    accelerator.end_training()
    if accelerator.is_main_process:
        print(f"done: {stop.step} steps, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
