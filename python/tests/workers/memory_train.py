"""A DDP job that snapshots to the memory tier: what a crash costs.

    memory_train.py OUT_DIR --ckpt-dir DIR [--memory-every N] [--save-every N]
                    [--steps N] [--step-time S] [--async-save]

Gloo on CPU, 2 ranks, a DataLoader with 2 worker processes over a dataset
whose length the world size does not divide, ``relaunch.InterruptibleSampler``,
SGD with momentum. ``relaunch.Checkpointer(save_every=, memory_every=)``:
rank 0 writes model, optimizer, sampler and step into each save (the other
ranks read it from the same node's memory tier on resume). Every rank
appends ``ATTEMPT STEP`` to ``OUT_DIR/steps.RANK`` once a step is done, and
``OUT_DIR/resumed.ATTEMPT.RANK`` says where it resumed from (step, tier).
At the end rank 0 saves the final model and optimizer to ``OUT_DIR/final.pt``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import relaunch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--memory-every", type=int, default=None)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--async-save", action="store_true")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("RELAUNCH_ATTEMPT", "0"))
    g = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(1001, 16, generator=g), torch.randn(1001, 4, generator=g))
    sampler = relaunch.InterruptibleSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = relaunch.Checkpointer(
        a.ckpt_dir, keep_last=2, save_every=a.save_every, memory_every=a.memory_every
    )
    step = 0
    resume = ckpt.latest()
    if resume is not None:
        state = resume.load_file("state.pt")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"] + 1
    (a.out / f"resumed.{attempt}.{rank}").write_text(
        json.dumps(
            {"step": resume.step, "tier": resume.tier} if resume is not None else {"step": None}
        )
    )
    steps = (a.out / f"steps.{rank}").open("a")
    done = False
    while not done:
        for x, y in loader:
            began = time.monotonic()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state = {
                "model": model.module.state_dict(),
                "opt": opt.state_dict(),
                "sampler": sampler.state_dict(),
                "step": step,
            }
            if a.async_save:
                # The other ranks join the round with nothing to write.
                ckpt.save_async(state if rank == 0 else None, step, "state.pt")
            else:
                with ckpt.save(step) as path:
                    if path is not None and rank == 0:
                        torch.save(state, path / "state.pt")
            steps.write(f"{attempt} {step}\n")
            steps.flush()
            if a.step_time:
                time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
            step += 1
            if step >= a.steps:
                done = True
                break
        if not done:
            sampler.set_epoch(sampler.epoch + 1)
    ckpt.close()
    if rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "opt": opt.state_dict()}, a.out / "final.pt"
        )
    dist.barrier()
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
