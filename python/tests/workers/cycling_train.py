"""A DDP training loop written the way cycling_utils' README writes one,
with only its import line changed to relaunch.compat.cycling_utils:
AtomicDirectory checkpoints every few steps (the model, an SGD optimizer
with momentum, the sampler), InterruptableDistributedSampler advanced after
each batch, a DataLoader with persistent workers, resume from the
``.latest_checkpoint`` link.

    relaunch run --nproc-per-node 2 cycling_train.py OUT TRACE [--params P]

Each rank appends ``epoch step indices loss`` per step to ``TRACE.RANK``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from relaunch.compat.cycling_utils import (
    AtomicDirectory,
    InterruptableDistributedSampler,
    atomic_torch_save,
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("trace")
    p.add_argument("--params", default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--keep-last", type=int, default=1)
    p.add_argument("--step-time", type=float, default=0.1)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(a.samples, 8, generator=g),
        torch.randn(a.samples, 1, generator=g),
        torch.arange(a.samples),
    )
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    saver = AtomicDirectory(a.out, is_master=rank == 0, keep_last=a.keep_last)
    sampler = InterruptableDistributedSampler(data)
    loader = DataLoader(
        data, batch_size=a.batch_size, sampler=sampler, num_workers=2, persistent_workers=True
    )
    link = os.path.join(a.out, saver.symlink_name)
    if os.path.islink(link):
        ckpt = torch.load(os.path.join(os.readlink(link), "checkpoint.pt"), weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sampler.load_state_dict(ckpt["sampler"])

    for epoch in range(sampler.epoch, a.epochs):
        with sampler.in_epoch(epoch):
            first = sampler.progress // a.batch_size
            for step, (x, y, idx) in enumerate(loader, start=first):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                sampler.advance(len(x))
                with open(f"{a.trace}.{rank}", "a") as f:
                    f.write(f"{epoch} {step} {idx.tolist()} {loss.item():.10f}\n")
                time.sleep(a.step_time)
                if (step + 1) % a.save_every == 0 or step + 1 == len(loader):
                    directory = saver.prepare_checkpoint_directory()
                    if rank == 0:
                        state = {
                            "model": model.state_dict(),
                            "optimizer": opt.state_dict(),
                            "sampler": sampler.state_dict(),
                        }
                        atomic_torch_save(state, os.path.join(directory, "checkpoint.pt"))
                    saver.symlink_latest(directory)
    if rank == 0 and a.params:
        torch.save(model.module.state_dict(), a.params)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
