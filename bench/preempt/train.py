"""The job both preemption benchmarks run: a small deterministic DDP job.

    relaunch run --nproc-per-node 2 [--server URL --run-id ID] bench/preempt/train.py \
        --ckpt-dir DIR --timing DIR [--launch N] [--final FILE]

Gloo on CPU, 2 ranks. A synthetic dataset of `--samples` (1001: not
divisible by the world size, so the sampler pads) read through a
DataLoader with `--num-workers` worker processes and
`relaunch.InterruptibleSampler` (shuffled, one order per epoch); an MLP
trained with SGD and momentum; `relaunch.Checkpointer` commits model,
optimizer, sampler and step every `--ckpt-every` steps and at the agreed
stop step (`preemption.reached(step)`), after which every rank exits 0.
Relaunched, it resumes from `ckpt.latest()`, mid-epoch included. Under
`relaunch run --server` every rank logs its loss at every step.

Every rank writes what the benchmarks measure, as wall-clock times
(`time.time()`), into `--timing`:
- `launchL.attemptA.rankR.json`: pid, process start (from /proc), first
  step (its start step, and when it was done), stop step and when it was
  done, when the process was about to exit; rewritten at each of those;
- `steps.rankR`: a line `launch attempt step time` per step done.
At the end of the job rank 0 saves the final model and optimizer state to
`--final` (the benchmark compares it bitwise with an uninterrupted run's).
"""

from __future__ import annotations

import atexit
import time

SCRIPT_START = time.time()
_EXIT_STAMP: list = []  # the path to write the interpreter's last moment to
atexit.register(lambda: _EXIT_STAMP and _EXIT_STAMP[0].write_text(repr(time.time())))

import argparse  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import relaunch  # noqa: E402

# relaunch.preemption turns SIGTERM into a stop request when imported: not
# in the torchrun peer (--plain-save), which must stop as torchrun's jobs do.
preemption = None if "--plain-save" in sys.argv else importlib.import_module("relaunch.preemption")


def process_start() -> float:
    """When this process was created, on the wall clock: its start in clock
    ticks since boot (/proc/self/stat) set against the uptime now (10 ms
    resolution; /proc/stat's btime is whole seconds, too coarse)."""
    now, uptime = time.time(), float(Path("/proc/uptime").read_text().split()[0])
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime, in ticks since boot
    return now - (uptime - started)


def dataset(samples: int) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=g)
    y = torch.tanh(x @ torch.randn(16, 4, generator=g)) + 0.1 * torch.randn(samples, 4, generator=g)
    return TensorDataset(x, y)


class Timing:
    """This process's timestamps, rewritten atomically whenever one is added."""

    def __init__(self, dir: Path, launch: int, attempt: int, rank: int) -> None:
        dir.mkdir(parents=True, exist_ok=True)
        self.path = dir / f"launch{launch}.attempt{attempt}.rank{rank}.json"
        _EXIT_STAMP.append(self.path.with_suffix(".atexit"))
        self.steps = (dir / f"steps.rank{rank}").open("a")
        self.prefix = f"{launch} {attempt}"
        self.data: dict = {
            "launch": launch,
            "attempt": attempt,
            "rank": rank,
            "pid": os.getpid(),
            "process_start": process_start(),
            "script_start": SCRIPT_START,
        }
        self.write()

    def set(self, **values: object) -> None:
        self.data.update(values)
        self.write()

    def step(self, step: int, when: float) -> None:
        self.steps.write(f"{self.prefix} {step} {when!r}\n")
        self.steps.flush()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def checkpoint(model: DDP, opt: torch.optim.Optimizer, sampler: object, step: int) -> dict:
    return {
        "model": model.module.state_dict(),
        "opt": opt.state_dict(),
        "sampler": sampler.state_dict(),  # type: ignore[attr-defined]
        "step": step,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--timing", type=Path, required=True)
    p.add_argument("--launch", type=int, default=0)
    p.add_argument("--final", type=Path, default=None)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1001)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.03)
    p.add_argument("--memory-every", type=int, default=None)
    p.add_argument(
        "--plain-save",
        action="store_true",
        help="torch.save to CKPT_DIR/state.pt every --ckpt-every steps, no Checkpointer "
        "(the peer under torchrun)",
    )
    a = p.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    a.ckpt_dir.mkdir(parents=True, exist_ok=True)
    timing = Timing(a.timing, a.launch, attempt, rank)
    timing.set(init_done=time.time())
    run = relaunch.init(config=vars(a)) if os.environ.get("RELAUNCH_SERVER") else None

    data = dataset(a.samples)
    sampler = relaunch.InterruptibleSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=a.batch_size, sampler=sampler, num_workers=a.num_workers)
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = None
    if not a.plain_save:
        ckpt = relaunch.Checkpointer(
            a.ckpt_dir, keep_last=2, save_every=a.ckpt_every, memory_every=a.memory_every
        )

    timing.set(ready=time.time())
    step = 0
    plain = a.ckpt_dir / "state.pt"
    state = None
    if ckpt is not None:
        resume = ckpt.latest()
        state = resume.load_file("state.pt") if resume is not None else None
    elif plain.exists():
        state = torch.load(plain)
    if state is not None:
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"] + 1
    timing.set(resumed=time.time())
    first = True
    stopped = False
    for epoch in range(sampler.epoch, a.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            began = time.monotonic()
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if run is not None:
                run.log({"loss": loss.item()}, step=step)
            done = time.time()
            timing.step(step, done)
            if first:
                timing.set(start_step=step, start_epoch=epoch, first_step_done=done)
                first = False
            if a.step_time:
                time.sleep(max(0.0, a.step_time - (time.monotonic() - began)))
            stopped = preemption is not None and preemption.reached(step)
            if ckpt is None:
                # What a torchrun job does: rank 0 saves every N steps,
                # atomically at best (a temporary name, then a rename).
                if rank == 0 and step % a.ckpt_every == 0:
                    torch.save(checkpoint(model, opt, sampler, step), plain.with_suffix(".tmp"))
                    os.replace(plain.with_suffix(".tmp"), plain)
            else:
                with ckpt.save(step, force=stopped) as path:
                    if path is not None and rank == 0:
                        torch.save(checkpoint(model, opt, sampler, step), path / "state.pt")
            if stopped:
                timing.set(stop_step=step, stop_epoch=epoch, stop_saved=time.time())
                break
            step += 1
        if stopped:
            break
    if not stopped:
        timing.set(stop_step=step - 1, finished=True)
        if rank == 0 and a.final is not None:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, a.final)
    if ckpt is not None:
        ckpt.close()  # waits for the checkpoint's upload, if shipping
    if run is not None:
        run.finish(timeout=60)
    # DDP holds the process group in reference cycles: free both while the
    # interpreter is whole (pytorch/pytorch#179291).
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    timing.set(exit=time.time(), preempted=stopped)
    sys.exit(0)


if __name__ == "__main__":
    main()
