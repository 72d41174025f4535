"""A training loop of several ranks in which one rank hangs, once.

Usage: hang_collective.py OUT_DIR [--stuck-rank R] [--stuck-step S] [--steps N]
[--no-beats]

Every rank draws a batch from a DataLoader (one worker, spawn, persistent),
all-reduces its sum over gloo and beats (``relaunch.heartbeat``) once per
step. In attempt 0, rank R stops at step S inside
``stuck_loading_a_batch`` (a name the hang report must show) and the others
block in ``all_reduce`` waiting for it. In a later attempt every rank runs
to the end and rank 0 writes ``OUT_DIR/done.ATTEMPT``. Times (for
bench/hang): ``OUT_DIR/stuck`` when the rank got stuck, and
``OUT_DIR/started.ATTEMPT.RANK`` when each rank's loop began, and
``OUT_DIR/beaten.ATTEMPT.RANK`` once it has beaten. ``--no-beats``:
the loop never beats (the launcher must then never call it hung).
``--step-sleep SECONDS``: attempt 0's steps take that long (a test freezes a
host mid-run).
"""

from __future__ import annotations

import argparse
import os
import time


def stuck_loading_a_batch(out: str) -> None:
    with open(os.path.join(out, "stuck"), "w") as f:
        f.write(repr(time.time()))
    time.sleep(3600)


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    import relaunch

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--stuck-rank", type=int, default=1)
    p.add_argument("--stuck-step", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--no-beats", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds a step, attempt 0")
    a = p.parse_args()
    attempt = int(os.environ["RELAUNCH_ATTEMPT"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = DataLoader(
        TensorDataset(torch.arange(64, dtype=torch.float32)),
        batch_size=4,
        num_workers=1,
        multiprocessing_context="spawn",
        persistent_workers=True,
    )
    batches = iter(loader)
    with open(os.path.join(a.out, f"started.{attempt}.{rank}"), "w") as f:
        f.write(repr(time.time()))
    for step in range(a.steps):
        if attempt == 0 and rank == a.stuck_rank and step == a.stuck_step:
            stuck_loading_a_batch(a.out)
        if attempt == 0 and a.step_sleep:
            time.sleep(a.step_sleep)
        try:
            (x,) = next(batches)
        except StopIteration:  # another epoch
            batches = iter(loader)
            (x,) = next(batches)
        total = x.sum()
        dist.all_reduce(total)
        if not a.no_beats:
            relaunch.heartbeat(step)
            if step == 0:
                with open(os.path.join(a.out, f"beaten.{attempt}.{rank}"), "w") as f:
                    f.write(repr(time.time()))
    if rank == 0:
        with open(os.path.join(a.out, f"done.{attempt}"), "w") as f:
            f.write(str(a.steps))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
