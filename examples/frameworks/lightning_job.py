"""A PyTorch Lightning job that survives preemption, with relaunch's callback.

    relaunch run --nproc-per-node 2 examples/frameworks/lightning_job.py --out /tmp/lit

Send the launcher SIGTERM (or Ctrl-C) while it trains: every rank stops
after the same batch, Lightning writes its checkpoint of that step, the
launcher exits 75. Run the same command again: it resumes there
(``ckpt_path="last"``) and trains exactly the batches an uninterrupted run
would have. A tiny model on synthetic data, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from relaunch.integrations.lightning import RelaunchCallback, RelaunchLogger


class Regression(L.LightningModule):
    def __init__(self, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("lightning-job"))
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 16)
    y = x @ torch.linspace(-1, 1, 16) + 0.1 * torch.randn(4096)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, num_workers=2)
    # One device per process `relaunch run` started, as under torchrun.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=nodes,
        strategy="ddp" if devices * nodes > 1 else "auto",
        max_epochs=args.epochs,
        callbacks=[RelaunchCallback(), ModelCheckpoint(dirpath=args.out / "ckpt", save_last=True)],
        logger=RelaunchLogger(project="lightning-job"),
        default_root_dir=args.out,
        enable_progress_bar=False,
    )
    trainer.fit(Regression(), loader, ckpt_path="last")
    if trainer.is_global_zero:
        print(f"done: {trainer.global_step} steps, loss {trainer.callback_metrics['loss']:.4f}")


if __name__ == "__main__":
    main()
