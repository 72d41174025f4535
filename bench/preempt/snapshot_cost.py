"""What a memory snapshot of a 100 MB training state every step costs.

    relaunch run --nproc-per-node 1 --snapshot-memory 1GiB \\
        bench/preempt/snapshot_cost.py OUT.json [--steps 40] [--width 2048] [--rounds 3]

One process on CPU: an MLP of three `--width` x `--width` layers (12.6 M
float32 parameters at 2048: 50 MB) trained with SGD and momentum (another
50 MB), a synthetic batch of 256. The same loop runs four ways, each
`--steps` steps after 5 warm-up steps: no checkpoint; the floor of any
in-memory snapshot, every tensor ``copy_``'d into CPU memory allocated
once (no file, no agreement, no commit); ``Checkpointer(save_every=10**9,
memory_every=1)`` with ``save_async`` (the state copied into the memory
tier on the caller, committed in the background); and the same with the
with-block (``torch.save`` into the memory tier on the caller), in
`--rounds` interleaved rounds. Reported: median step time
of each, the overhead over no checkpoint, the median time a step spends in
the checkpointer's call (the rest of the overhead is the background commit
competing for the cores), and where the time of one snapshot would go
another way (a CPU copy, ``torch.save`` into the tier, BLAKE3), each timed
alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

import relaunch
from relaunch import _native


def model_and_opt(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(3)]
    model = torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1], torch.nn.Tanh(), layers[2])
    return model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def loop(width: int, steps: int, mode: str, ckpt_dir: Path) -> tuple[list[float], list[float]]:
    """Step times, and the time of each step spent in the checkpointer's call."""
    model, opt = model_and_opt(width)
    x, y = torch.randn(256, width), torch.randn(256, width)
    ckpt = None
    if mode in ("save_async", "with_block"):
        ckpt = relaunch.Checkpointer(ckpt_dir, save_every=10**9, memory_every=1)
    bare: list[torch.Tensor] | None = None
    if mode == "bare_copy":
        # The floor: every tensor copied into CPU memory allocated once, no
        # file, no agreement, no commit.
        bare = []
    times, calls = [], []
    for step in range(1, steps + 6):
        began = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        called = time.perf_counter()
        if bare is not None:
            tensors = _tensors({"model": model.state_dict(), "opt": opt.state_dict()})
            if not bare:
                bare.extend(torch.empty_like(t) for t in tensors)
            for dst, src in zip(bare, tensors, strict=True):
                dst.copy_(src)
        if ckpt is not None:
            state = {"model": model.state_dict(), "opt": opt.state_dict()}
            if mode == "save_async":
                ckpt.save_async(state, step, "state.pt")
            else:
                with ckpt.save(step) as path:
                    assert path is not None
                    torch.save(state, path / "state.pt")
        if step > 5:
            now = time.perf_counter()
            times.append(now - began)
            calls.append(now - called)
    if ckpt is not None:
        ckpt.close()
        latest = ckpt.latest()
        assert latest is not None and latest.tier == "memory", latest
        # Frees the node's tier for the next loop (the launcher would at exit).
        assert ckpt._memory is not None
        shutil.rmtree(ckpt._memory.root)
    return times, calls


def _tensors(state: dict) -> list[torch.Tensor]:
    """Every tensor of ``state``, walked as the snapshot writer walks it."""
    from relaunch._checkpoint_stage import rebuild

    out: list[torch.Tensor] = []

    def leaf(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        return obj

    rebuild(state, leaf)
    return out


def parts(width: int, tier: Path) -> dict[str, float]:
    """One snapshot's pieces, each timed alone (medians of 5)."""
    from relaunch._checkpoint_stage import Stager

    model, opt = model_and_opt(width)
    loss = model(torch.randn(8, width)).sum()
    loss.backward()
    opt.step()
    state = {"model": model.state_dict(), "opt": opt.state_dict()}
    stager = Stager()
    copy, save, hash_ = [], [], []
    for _ in range(5):
        t = time.perf_counter()
        staged = stager.copy(state, torch)
        copy.append(time.perf_counter() - t)
        t = time.perf_counter()
        torch.save(staged, tier / "probe.pt")
        save.append(time.perf_counter() - t)
        t = time.perf_counter()
        _native.hash_file(tier / "probe.pt")
        hash_.append(time.perf_counter() - t)
    size = (tier / "probe.pt").stat().st_size
    (tier / "probe.pt").unlink()
    return {
        "state_mb": size / 1e6,
        "copy_s": statistics.median(copy),
        "torch_save_s": statistics.median(save),
        "blake3_s": statistics.median(hash_),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    node_tier = Path(os.environ["RELAUNCH_SNAPSHOT_DIR"])
    work = Path(tempfile.mkdtemp(prefix="snapshot-cost-"))
    try:
        result: dict = {"width": a.width, "steps": a.steps}
        samples: dict[str, list[float]] = {}
        in_call: dict[str, list[float]] = {}
        # Interleaved rounds: a drift of the machine hits every mode alike.
        for round in range(a.rounds):
            for mode in ("none", "bare_copy", "save_async", "with_block"):
                times, calls = loop(a.width, a.steps, mode, work / f"{mode}-{round}")
                samples.setdefault(mode, []).extend(times)
                in_call.setdefault(mode, []).extend(calls)
                print(
                    f"round {round} {mode}: median step {statistics.median(times) * 1e3:.1f} ms",
                    flush=True,
                )
        for mode in samples:
            result[mode] = statistics.median(samples[mode])
            result[f"{mode}_in_call"] = statistics.median(in_call[mode])
        for mode in ("bare_copy", "save_async", "with_block"):
            result[f"{mode}_overhead"] = result[mode] / result["none"] - 1
        result["parts"] = parts(a.width, node_tier)
        print(json.dumps(result, indent=1), flush=True)
        a.out.write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
