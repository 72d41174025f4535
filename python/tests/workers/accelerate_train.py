"""An accelerate training loop as people write one, with relaunch's tracker
and preemption.

Usage: accelerate_train.py OUT [--epochs N] [--step-time S] [--workers N]
       [--signal-at STEP] [--hang-at STEP] [--crash-at STEP]
       [--dropout P] [--accumulate N]

The regression model of ``lightning_train.py`` on 64 synthetic samples
(``--dropout``: a dropout layer; ``--accumulate``: accelerate's gradient
accumulation over that many batches), ``accelerator.prepare`` (DDP on gloo
over the launcher's ranks, the seedable sampler, ``shuffle=True``),
checkpoints only at a stop. Every rank appends ``epoch step sample...`` for
each batch it trains to ``OUT/trace.RANK``; rank 0 writes the final
parameters to ``OUT/params.pt``.
``--signal-at``, ``--hang-at`` and ``--crash-at`` act on rank 1 of the first
attempt at that step (counted from 0), as in ``lightning_train.py``;
``--no-relaunch`` runs the same loop without relaunch, saving every
``--save-every`` steps.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader, Dataset

from relaunch.integrations.accelerate import Preemption, RelaunchTracker


class Samples(Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.arange(8.0) + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--no-relaunch", action="store_true")
    parser.add_argument("--save-every", type=int, default=0, help="steps between checkpoints")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(
        cpu=True,
        log_with=[] if args.no_relaunch else [RelaunchTracker()],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        gradient_accumulation_steps=args.accumulate,
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Dropout(args.dropout),
        torch.nn.Linear(16, 1),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(), batch_size=4, shuffle=True, num_workers=args.workers)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("accelerate", config={"step_time": args.step_time, "lr": 0.01})
    rank = accelerator.process_index
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if args.no_relaunch:
        plain(args, accelerator, model, optimizer, loader)
        return
    stop = Preemption(accelerator, args.out / "ckpt")
    for epoch in stop.epochs(args.epochs):
        for x, y, idx in stop.batches(loader):
            step = stop.step
            if rank == 1 and first_attempt:
                if step == args.crash_at:
                    os._exit(1)
                if step == args.hang_at:
                    time.sleep(3600)
                if step == args.signal_at:
                    os.kill(os.getpid(), signal.SIGTERM)
            with open(args.out / f"trace.{rank}", "a") as f:
                f.write(f"{epoch} {step} {' '.join(map(str, idx.tolist()))}\n")
            time.sleep(args.step_time)
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=step)
            if stop.reached():
                sys.exit(0)
    accelerator.end_training()
    if accelerator.is_main_process:
        state = accelerator.unwrap_model(model).state_dict()
        torch.save({k: v.clone() for k, v in state.items()}, args.out / "params.pt")


def plain(args, accelerator, model, optimizer, loader) -> None:
    """The loop without relaunch, as under torchrun: a checkpoint every
    --save-every steps, nothing at a stop signal."""
    step = 0
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        for x, y, idx in loader:
            with open(args.out / f"trace.{accelerator.process_index}", "a") as f:
                f.write(f"{epoch} {step} {' '.join(map(str, idx.tolist()))}\n")
            time.sleep(args.step_time)
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            step += 1
            if args.save_every and step % args.save_every == 0:
                accelerator.save_state(str(args.out / "ckpt" / f"step_{step:08d}"))


if __name__ == "__main__":
    main()
