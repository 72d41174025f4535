"""A Lightning job as people write one, with relaunch's callback and logger.

Usage: lightning_train.py OUT [--epochs N] [--step-time S] [--workers N]
       [--hang-at STEP] [--crash-at STEP] [--no-relaunch]
       [--dropout P] [--accumulate N]

A tiny regression model (``--dropout``: with a dropout layer;
``--accumulate``: ``accumulate_grad_batches``) on 64 synthetic samples, DDP
on gloo with as many devices as the launcher started ranks, a plain
``DataLoader(shuffle=True)`` that Lightning gives its distributed sampler,
and ``fit(ckpt_path="last")``. Every rank appends ``epoch step sample...``
for each batch it trains to ``OUT/trace.RANK``; rank 0 writes the final
parameters to ``OUT/params.pt``.
``--crash-at`` makes rank 1 of the first attempt exit 1 at that step;
``--hang-at`` makes rank 1 sleep forever there; ``--no-relaunch`` leaves
relaunch out (Lightning alone, as under torchrun), ``--save-every N`` adds
a checkpoint every N steps; ``--signal-at`` makes rank
1 of the first attempt send itself SIGTERM there (one rank signalled, at a
known step: with ``--step-time 0.15`` the ranks agree to stop 3 steps
later).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from relaunch.integrations.lightning import RelaunchCallback, RelaunchLogger


class Samples(Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.arange(8.0) + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


class Regression(L.LightningModule):
    def __init__(
        self,
        out: Path,
        step_time: float,
        hang_at: int,
        crash_at: int,
        signal_at: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["out"])
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16),
            torch.nn.Tanh(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(16, 1),
        )
        self.out = out

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        step = self.trainer.global_step
        rank = self.trainer.global_rank
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if rank == 1 and first_attempt and step == self.hparams.crash_at:
            os._exit(1)
        if rank == 1 and first_attempt and step == self.hparams.hang_at:
            time.sleep(3600)
        if rank == 1 and first_attempt and step == self.hparams.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        with open(self.out / f"trace.{rank}", "a") as f:
            f.write(f"{self.current_epoch} {step} {' '.join(map(str, idx.tolist()))}\n")
        time.sleep(self.hparams.step_time)
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--no-relaunch", action="store_true")
    parser.add_argument("--save-every", type=int, default=0, help="steps between checkpoints")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    loader = DataLoader(
        Samples(),
        batch_size=4,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    relaunch = [] if args.no_relaunch else [RelaunchCallback()]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=args.epochs,
        accumulate_grad_batches=args.accumulate,
        callbacks=[
            *relaunch,
            ModelCheckpoint(
                dirpath=args.out / "ckpt",
                save_last=True,
                every_n_train_steps=args.save_every or None,
            ),
        ],
        logger=False if args.no_relaunch else RelaunchLogger(project="lightning"),
        default_root_dir=args.out,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        deterministic=True,
    )
    model = Regression(
        args.out, args.step_time, args.hang_at, args.crash_at, args.signal_at, args.dropout
    )
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.global_rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out / "params.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
