"""A DDP training job that resumes exactly where it stopped.

    relaunch run --nproc-per-node 2 --server URL --run-id job42 examples/resume.py --ckpt-dir ckpt

It trains a small MLP on a synthetic dataset, on each rank's GPU with NCCL
where the node has a GPU for each of its ranks (``--device auto``, the
default) and else on the CPU with gloo, deterministically either way, and
uses the three pieces a preemptible job needs:

- ``relaunch.InterruptibleSampler`` deals the data like ``DistributedSampler``
  and records how far the epoch got;
- ``relaunch.Checkpointer`` commits model, optimizer, sampler and step every
  ``--ckpt-every`` steps, atomically, and when the job is asked to stop;
- ``relaunch.preemption`` makes every rank stop at the same step when the
  launcher gets SIGTERM, so that step's checkpoint is forced on all ranks.

Relaunched, it resumes from ``ckpt.latest()``: the loss of every step equals
that of an uninterrupted run. Under ``relaunch run --server`` every rank
logs its loss, and the Checkpointer ships each checkpoint to the server, so
``relaunch ckpt pull RUN CKPT_DIR`` can bring it to a machine that never
saw it. ``--losses FILE``: rank 0 appends ``step loss`` per step;
``--params FILE``: rank 0 saves the final parameters there once training
has finished (not when stopped).
"""

from __future__ import annotations

# First, before torch (seconds to import, more on a loaded node): from here
# on a stop signal is a request to stop at an agreed step, not the death of
# the rank. SLURM's time-limit warning can arrive while a rank is starting.
from relaunch import preemption  # isort: skip

import argparse
import gc
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import relaunch


def dataset(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 4, generator=g)) + 0.1 * torch.randn(samples, 4, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--losses", type=Path, default=None)
    p.add_argument("--params", type=Path, default=None)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    a = p.parse_args()

    # auto: the GPUs when this node has one for each of its ranks.
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = a.device == "cuda" or (a.device == "auto" and torch.cuda.device_count() >= local_ranks)
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        # Bitwise-repeatable steps on the GPU, so a resumed run equals an
        # uninterrupted one (cuBLAS needs a fixed workspace for that).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    run = relaunch.init(config=vars(a)) if os.environ.get("RELAUNCH_SERVER") else None

    data = dataset(a.samples)
    sampler = relaunch.InterruptibleSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).to(
            device
        ),
        device_ids=[device.index] if cuda else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = relaunch.Checkpointer(a.ckpt_dir, keep_last=2, save_every=a.ckpt_every)

    step = 0
    resume = ckpt.latest()
    if resume is not None:
        state = resume.load_file("state.pt", map_location=device)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"] + 1
        # DDP lays its gradient buckets out anew after a process's first
        # backward pass; on more than 2 ranks a resumed process's first step
        # would sum in another order than the uninterrupted run's. Rebuilt
        # now, by a pass that changes nothing, the resume is bitwise.
        x0, _ = next(iter(DataLoader(data, batch_size=a.batch_size)))
        relaunch.ddp.rebuild_buckets(model, x0.to(device))
    print(f"rank {rank}: starting at step {step}, epoch {sampler.epoch}, on {device}", flush=True)

    stopped = False
    for epoch in range(sampler.epoch, a.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            began = time.monotonic()
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean = mean.item() / dist.get_world_size()
            if rank == 0 and a.losses is not None:
                with a.losses.open("a") as f:
                    f.write(f"{step} {mean!r}\n")
            if run is not None:
                run.log({"loss": loss.item(), "epoch": epoch}, step=step)
            if a.step_time:
                time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
            stopped = preemption.reached(step)
            with ckpt.save(step, force=stopped) as path:
                if path is not None and rank == 0:
                    state = {
                        "model": model.module.state_dict(),
                        "opt": opt.state_dict(),
                        "sampler": sampler.state_dict(),
                        "step": step,
                    }
                    torch.save(state, path / "state.pt")
            step += 1
            if stopped:
                break
        if stopped:
            break
    print(
        f"rank {rank}: {'preempted' if stopped else 'finished'} after step {step - 1}", flush=True
    )
    if rank == 0 and a.params is not None and not stopped:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, a.params)
    ckpt.close()  # waits for the checkpoint's upload, if shipping
    if run is not None:
        run.finish(timeout=30)
    # DDP holds the process group, in reference cycles: free both while the
    # interpreter is whole. A gloo group destroyed during interpreter
    # teardown can abort the process ("terminate called without an active
    # exception"; see pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
