"""A loop of its own on ``relaunch.Checkpointer`` that draws random numbers
the way training does: dropout in the model, numpy and Python ``random``
noise on the inputs, a shuffled ``InterruptibleSampler``, DataLoader workers.

    ckpt_rng_train.py OUT_DIR --ckpt-dir DIR [--stop-at STEP] [--workers N]
                      [--persistent] [--no-rng] [--epochs E]

With ``--stop-at STEP`` it saves that step's checkpoint and exits 0, as a
job stopped there does; run again, it resumes from ``ckpt.latest()``. It
builds its model after ``latest()`` and, on a resume, makes an iterator of
another loader first (as scripts do to probe a batch): draws that an
uninterrupted run does not make. At the end rank 0 writes
``OUT_DIR/params.pt``, the final parameters.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

import numpy
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import relaunch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--stop-at", type=int, default=None)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--no-rng", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(rank)
    numpy.random.seed(rank)
    random.seed(rank)

    g = torch.Generator().manual_seed(1234)
    data = TensorDataset(
        torch.randn(48 * world, 8, generator=g), torch.randn(48 * world, 1, generator=g)
    )
    sampler = relaunch.InterruptibleSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    loader = DataLoader(
        data,
        batch_size=4,
        sampler=sampler,
        num_workers=a.workers,
        persistent_workers=a.persistent and a.workers > 0,
    )
    ckpt = relaunch.Checkpointer(a.ckpt_dir, keep_last=2, save_every=1000, rng=not a.no_rng)

    resume = ckpt.latest()
    if resume is not None:
        next(iter(DataLoader(data, batch_size=2)))  # a probe: draws a base seed
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = 0
    if resume is not None:
        state = resume.load_file(f"state.{rank}.pt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"] + 1

    for epoch in range(sampler.epoch, a.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            noise = torch.from_numpy(numpy.random.randn(*x.shape)).float() * 0.01
            x = x + noise * random.random()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if world > 1:
                for param in model.parameters():
                    dist.all_reduce(param.grad)
            opt.step()
            stop = step == a.stop_at
            with ckpt.save(step, force=stop) as path:
                if path is not None:
                    state = {
                        "model": model.state_dict(),
                        "opt": opt.state_dict(),
                        "sampler": sampler.state_dict(),
                        "step": step,
                    }
                    torch.save(state, path / f"state.{rank}.pt")
            if stop:
                sys.exit(0)
            step += 1
    if rank == 0:
        torch.save(model.state_dict(), a.out / "params.pt")


if __name__ == "__main__":
    main()
