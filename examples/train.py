"""A small DDP training job that survives failures and preemption.

Run it under the launcher:

    relaunch run --nproc-per-node 2 --max-restarts 3 examples/train.py --ckpt-dir /tmp/ckpt

It trains a linear model on synthetic data with gloo, saves a checkpoint
every few steps (rank 0 writes, atomically), resumes from the newest one
after a restart, and stops cleanly when asked to (``relaunch.preemption``):
every rank agrees on one stop step, rank 0 saves it, all exit 0.

Under ``relaunch run --server URL`` every rank logs its loss to the job's
run on the tracking server (``relaunch.init()`` finds the run, the attempt
and the server in the environment the launcher sets).

Options for demonstrations and tests:
    --fail-at RANK:STEP   that rank crashes at that step, on the first attempt only
    --step-time SECONDS   make each step last at least this long
    --progress            draw a tqdm-style progress bar on stderr
    --out FILE            rank 0 writes a JSON summary there at the end
"""

from __future__ import annotations

# First, before torch: from here on a stop signal asks every rank to stop
# at an agreed step instead of killing a rank that is still starting.
from relaunch import preemption  # isort: skip

import argparse
import gc
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

import relaunch


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    steps = sorted(
        (int(p.stem.split("_")[1]), p) for p in ckpt_dir.glob("step_*.pt") if p.stem[5:].isdigit()
    )
    return steps[-1][1] if steps else None


def save_checkpoint(ckpt_dir: Path, step: int, model: torch.nn.Module, opt) -> Path:
    """Rank 0 writes to a temporary name and renames: never a torn file."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)
    return path


@record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--fail-at", default=None)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    # Tracked only when the launcher was given a server.
    run = relaunch.init(config=vars(a)) if os.environ.get("RELAUNCH_SERVER") else None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    ckpt = latest_checkpoint(a.ckpt_dir)
    if ckpt is not None:
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    print(f"rank {rank}/{world} attempt {attempt}: starting at step {start}", flush=True)

    fail_rank, fail_step = (int(x) for x in a.fail_at.split(":")) if a.fail_at else (-1, -1)
    data = torch.Generator().manual_seed(1234 + rank)
    stopped_at = None
    for step in range(start, a.steps):
        began = time.monotonic()
        x = torch.randn(32, 16, generator=data)
        y = x[:, :4] * 2.0
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if run is not None:
            run.log({"loss": loss.item(), "lr": opt.param_groups[0]["lr"]}, step=step)
        if rank == fail_rank and step == fail_step and attempt == 0:
            raise RuntimeError(f"injected failure at step {step}")
        if rank == 0 and a.progress:
            done = step + 1
            bar = "#" * (20 * done // a.steps)
            print(
                f"\r{100 * done // a.steps:3d}%|{bar:<20}| {done}/{a.steps}",
                end="",
                file=sys.stderr,
            )
        if rank == 0 and (step + 1) % a.ckpt_every == 0:
            save_checkpoint(a.ckpt_dir, step, model.module, opt)
        if a.step_time:
            time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
        if preemption.reached(step):
            stopped_at = step
            break
    if rank == 0 and a.progress:
        print(file=sys.stderr)

    last = stopped_at if stopped_at is not None else a.steps - 1
    if rank == 0:
        save_checkpoint(a.ckpt_dir, last, model.module, opt)
    # Every rank reports the step it stopped at; the test compares them.
    print(f"rank {rank}: stopped at step {last} (preempted: {stopped_at is not None})", flush=True)
    if a.out is not None:
        report = {
            "rank": rank,
            "step": last,
            "preempted": stopped_at is not None,
            "attempt": attempt,
        }
        Path(f"{a.out}.{rank}").write_text(json.dumps(report))
    dist.barrier()
    # DDP holds the process group, in reference cycles: free both while the
    # interpreter is whole. A gloo group destroyed during interpreter
    # teardown can abort the process ("terminate called without an active
    # exception"; see pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    if run is not None:
        try:
            run.finish(timeout=30)
        except relaunch.TrackingError as e:
            # Kept in the spool: the next launch of this run ships it.
            print(f"rank {rank}: tracking server: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
