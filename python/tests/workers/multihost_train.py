"""A DDP job (gloo) for multi-host tests and bench/multihost: every step's
data depends only on (step, rank), so a run's parameters depend only on
its world size and steps, however its ranks are placed on hosts.

Rank 0 saves a checkpoint (model, optimizer, step) after every step into
``OUT/ckpt.pt``; a new attempt resumes from it. Every rank appends one JSON
line per completed step to ``OUT/steps.HOST.PID.jsonl``: host (``$MH_HOST``),
the step its attempt resumed from (``start``: the same for every rank of one
attempt, and different for every attempt that completed a step, so it
names the attempt, elastic round or not), rank, world size, step,
``RELAUNCH_ATTEMPT`` and ``TORCHELASTIC_RESTART_COUNT`` (``attempt``,
``restarts``), and the wall-clock time it completed.

    --steps N         train steps 0..N-1
    --min-world W     and do not end before a step in a world of at least W
                      ranks (a lost node must be readmitted before the job
                      ends), unless step --max-steps is reached
    --step-time S     each step lasts at least S seconds
    --timeout S       the process group's timeout (a collective with a
                      silent peer fails after it)
    --preemption      import ``relaunch.preemption`` and stop, cleanly and
                      without ``final.pt``, at the step ``reached`` agrees
                      (a line ``{"stopped": STEP}`` in the steps file)
    --fail-file       exit 1 as soon as ``OUT/fail.HOST`` exists (polled by
                      a thread, so also while blocked in a collective)

At the end rank 0 writes ``OUT/final.pt``: the parameters, and the step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--min-world", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--preemption", action="store_true")
    p.add_argument("--fail-file", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    host = os.environ.get("MH_HOST", "?")
    if a.fail_file:
        threading.Thread(target=fail_when_told, args=(a.out / f"fail.{host}",), daemon=True).start()
    preemption = None
    if a.preemption:
        from relaunch import preemption

    dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = {
        "attempt": int(os.environ.get("RELAUNCH_ATTEMPT", "-1")),
        "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
    }

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = a.out / "ckpt.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1

    log = open(a.out / f"steps.{host}.{os.getpid()}.jsonl", "a", buffering=1)
    step = start
    stopped = False
    while step < a.steps or (a.min_world and not (world >= a.min_world and step > start)):
        if step >= a.max_steps:
            break
        began = time.monotonic()
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = x[:, :4] * 2.0 + 0.1 * torch.randn(32, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {"step": step, "model": model.module.state_dict(), "opt": opt.state_dict()}, tmp
            )
            os.replace(tmp, ckpt)
        record = {"host": host, "start": start, "rank": rank, "world": world, "step": step, **ids}
        log.write(json.dumps({**record, "t": time.time()}) + "\n")
        if a.step_time:
            time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
        if preemption is not None and preemption.reached(step):
            log.write(json.dumps({"stopped": step, "host": host, "rank": rank}) + "\n")
            stopped = True
            break
        step += 1

    if rank == 0 and not stopped:
        final = {"step": step - 1, "world": world, "params": model.module.state_dict()}
        torch.save(final, a.out / "final.pt")
    dist.barrier()
    # DDP holds the process group in reference cycles: free both while the
    # interpreter is whole (pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()


def fail_when_told(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)
    os._exit(1)


if __name__ == "__main__":
    main()
