"""A DDP training loop as people write it: a DataLoader with worker
processes (any start method, persistent or not, pinned memory), SGD with
momentum, a checkpoint at the step every rank agrees to stop at.

    loader_train.py OUT_DIR --workers N --start-method fork|spawn|forkserver
                    [--persistent] [--pin-memory] [--daemon]

Each rank writes ``OUT_DIR/pids.RANK`` (its pid and its descendants' pids:
DataLoader workers and their helpers) once training is under way (step 20), and at the end
``OUT_DIR/out.RANK``: the step it stopped at and whether it was preempted.
Rank 0 writes ``OUT_DIR/ckpt_STEP.pt`` at the stop step. With ``--daemon``
rank 0 first starts ``setsid sleep 1000`` (a process in a session of its
own, as logging services start theirs) and writes its pid to
``OUT_DIR/daemon``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from relaunch import preemption


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--daemon", action="store_true")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if a.daemon and rank == 0:
        daemon = subprocess.Popen(["setsid", "sleep", "1000"])
        (a.out / "daemon").write_text(str(daemon.pid))

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(6145, 8), torch.randn(6145, 1))
    loader = DataLoader(
        data,
        batch_size=16,
        shuffle=True,
        num_workers=a.workers,
        multiprocessing_context=a.start_method if a.workers else None,
        persistent_workers=a.persistent and a.workers > 0,
        pin_memory=a.pin_memory,
    )
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step, stopped = 0, False
    for _epoch in range(1000):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(0.02)
            if step == 20:
                kids = _descendants(os.getpid())
                tmp = a.out / f"pids.{rank}.tmp"
                tmp.write_text(json.dumps({"rank": os.getpid(), "children": kids}))
                tmp.rename(a.out / f"pids.{rank}")
            if preemption.reached(step):
                if rank == 0:
                    torch.save(model.module.state_dict(), a.out / f"ckpt_{step}.pt")
                stopped = True
                break
            step += 1
        if stopped:
            break
    (a.out / f"out.{rank}").write_text(
        json.dumps({"step": step, "preempted": stopped, "agreed": preemption.stop_step()})
    )
    sys.exit(0)


def _descendants(pid: int) -> list[int]:
    """Children, and theirs (forkserver's workers are the server's)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rfind(")") + 2 :].split()[1])
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child, of in parents.items():
            if of == parent:
                out.append(child)
                todo.append(child)
    return out


if __name__ == "__main__":
    main()
