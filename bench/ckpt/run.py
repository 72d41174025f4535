"""The checkpoint benchmark: what `relaunch.Checkpointer` costs over a plain
`torch.save` of the same state to the same disk, same run, as ratios.

    .venv/bin/python bench/ckpt/run.py [--repeat 5] [--sizes 256,1024] [--quick]
                                       [--device cuda]

One process, world size 1, CPU tensors (GPU tensors with `--device cuda`):
a transformer-like state_dict (blocks of attention and MLP weights, biases
and norms, float32) of each size. Sides, run alternately `--repeat` times (the order rotating), each
writing a new file into a fresh directory on the same disk, medians kept:
- `torch.save`: `torch.save(state, DIR/model.pt)`, nothing else: the file
  is in the page cache, not yet on disk;
- `torch.save + fsync`: the same, then fsync of the file and of DIR, which
  is what durability on its own costs;
- `Checkpointer.save`: `with ckpt.save(step) as path: torch.save(state,
  path / "model.pt")`, timed from entering the block until it returns,
  committed: the file fsynced and hashed (BLAKE3), the manifest written
  and fsynced, the directory renamed, `latest` swapped, DIR fsynced;
- `save_async`: the time `ckpt.save_async(state, step)` blocks the caller
  (the copy of the tensors to CPU memory), first call (buffers allocated)
  and a later one (buffers reused); then `wait()`, untimed, and the time
  until the checkpoint is committed, for the record;
- `dcp.async_save`: the time PyTorch's own asynchronous checkpoint,
  `torch.distributed.checkpoint.async_save(state, checkpoint_id=DIR,
  no_dist=True)`, blocks the caller (it stages the tensors to CPU memory),
  a first and a later call of one process, each into a fresh DIR; then
  `result()`, untimed.
Before each sample `sync` flushes what earlier samples left dirty (untimed).
Results go to stdout as a markdown table and to bench/out/ckpt.json. The
ratio is the Checkpointer's time over the peer's (lower is better here:
the targets are at most 1.1x and at most 0.2x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

import relaunch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import compare, fsync_path, gpt_state_dict, write_result  # noqa: E402

MIB = 1 << 20
# No shipping to a tracking server and no agreement: one process on its own.
for var in ("RELAUNCH_SERVER", "RELAUNCH_RUN_ID", "RELAUNCH_STORE", "RANK", "WORLD_SIZE"):
    os.environ.pop(var, None)


def state_dict(total: int, device: str) -> dict[str, torch.Tensor]:
    """GPT-like blocks (d=512: 12 MiB of float32 each) filling `total` bytes."""
    state = gpt_state_dict(total, 512, torch.Generator().manual_seed(0))[0]
    return {k: v.to(device) for k, v in state.items()}


class Bench:
    def __init__(self, scratch: Path, repeat: int) -> None:
        self.scratch = scratch
        self.repeat = repeat
        self.samples: dict[str, list[float]] = {}
        self.rows: list[dict] = []

    def fresh(self) -> Path:
        os.sync()
        return Path(tempfile.mkdtemp(prefix="ckpt-", dir=self.scratch))

    def sample(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds)

    def torch_save(self, state: dict, key: str, durable: bool) -> None:
        d = self.fresh()
        started = time.perf_counter()
        torch.save(state, d / "model.pt")
        if durable:
            fsync_path(d / "model.pt")
            fsync_path(d)
        self.sample(key, time.perf_counter() - started)
        shutil.rmtree(d)

    def checkpointer(self, state: dict, key: str) -> None:
        d = self.fresh()
        ckpt = relaunch.Checkpointer(d, keep_last=None)
        started = time.perf_counter()
        with ckpt.save(1) as path:
            torch.save(state, path / "model.pt")
        self.sample(key, time.perf_counter() - started)
        assert ckpt.latest(verify="full") is not None
        ckpt.close()
        shutil.rmtree(d)

    def save_async(self, state: dict, key: str) -> None:
        d = self.fresh()
        ckpt = relaunch.Checkpointer(d, keep_last=None)
        for step, which in ((1, "first"), (2, "later")):
            os.sync()
            started = time.perf_counter()
            ckpt.save_async(state, step)
            blocked = time.perf_counter()
            ckpt.wait()
            self.sample(f"{key} {which}", blocked - started)
            self.sample(f"{key} {which} committed", time.perf_counter() - started)
        assert ckpt.latest(verify="full").step == 2
        ckpt.close()
        shutil.rmtree(d)

    def dcp_async_save(self, state: dict, key: str) -> None:
        import torch.distributed.checkpoint as dcp

        for which in ("first", "later"):
            d = self.fresh()
            started = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=d, no_dist=True)
            self.sample(f"{key} {which}", time.perf_counter() - started)
            future.result()
            shutil.rmtree(d)

    def row(self, name: str, ours: str, theirs: str, peer: str, target: float | None) -> None:
        row = compare(
            name, self.samples[ours], self.samples[theirs], peer, target, ours_over_theirs=True
        )
        self.rows.append(row)
        a, b, ratio = row["relaunch"], row["peer"], row["ratio"]
        print(f"{name:<64} relaunch {a:.3f} s  {peer} {b:.3f} s  ratio {ratio:.2f}x", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int)
    p.add_argument("--sizes", help="state_dict sizes in MiB [256,1024]")
    p.add_argument("--quick", action="store_true", help="64 MiB, 1 repeat")
    p.add_argument("--scratch", type=Path, default=ROOT / "bench" / "out")
    p.add_argument("--device", default="cpu", help="where the state lives: cpu or cuda [cpu]")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False on this machine")
    repeat = a.repeat or (1 if a.quick else 5)
    sizes = [int(s) for s in (a.sizes or ("64" if a.quick else "256,1024")).split(",")]
    a.scratch.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=a.scratch))
    bench = Bench(scratch, repeat)
    started = time.time()
    gpu = torch.cuda.get_device_name() if a.device == "cuda" else None
    print(
        f"# checkpoint benchmark, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"state on {gpu or a.device}, median of {repeat}",
        flush=True,
    )
    try:
        for mib in sizes:
            state = state_dict(mib * MIB, a.device)
            size = f"{mib} MiB" if mib < 1024 else f"{mib // 1024} GiB"
            sides = [
                lambda s=state, k=size: bench.torch_save(s, f"{k} torch.save", False),
                lambda s=state, k=size: bench.torch_save(s, f"{k} torch.save+fsync", True),
                lambda s=state, k=size: bench.checkpointer(s, f"{k} Checkpointer"),
                lambda s=state, k=size: bench.save_async(s, f"{k} save_async"),
                lambda s=state, k=size: bench.dcp_async_save(s, f"{k} dcp.async_save"),
            ]
            bench.torch_save(state, "warm-up", False)  # first-touch costs, not measured
            for i in range(repeat):
                for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                    side()
            k = size
            bench.row(f"{k}: commit vs torch.save", f"{k} Checkpointer", f"{k} torch.save",
                      "torch.save", 1.1)  # fmt: skip
            bench.row(f"{k}: commit vs torch.save + fsync", f"{k} Checkpointer",
                      f"{k} torch.save+fsync", "torch.save+fsync", 1.1)  # fmt: skip
            bench.row(f"{k}: save_async blocked, later saves", f"{k} save_async later",
                      f"{k} torch.save", "torch.save", 0.2)  # fmt: skip
            bench.row(f"{k}: save_async blocked, first save", f"{k} save_async first",
                      f"{k} torch.save", "torch.save", None)  # fmt: skip
            bench.row(f"{k}: save_async blocked vs dcp.async_save, later saves",
                      f"{k} save_async later", f"{k} dcp.async_save later", "dcp.async_save",
                      None)  # fmt: skip
            bench.row(f"{k}: save_async blocked vs dcp.async_save, first save",
                      f"{k} save_async first", f"{k} dcp.async_save first", "dcp.async_save",
                      None)  # fmt: skip
            bench.row(f"{k}: save_async until committed", f"{k} save_async later committed",
                      f"{k} torch.save", "torch.save", None)  # fmt: skip
            del state
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = {
        "started": started,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "device": gpu or a.device,
        "python": sys.version.split()[0],
        "repeat": repeat,
        "rows": bench.rows,
        "samples": bench.samples,
    }
    name = "ckpt" if a.device == "cpu" else f"ckpt.{a.device}"
    write_result(f"{name}.quick" if a.quick else name, result)
    print("\n| figure | relaunch | peer | ratio | target | met? |\n|---|---|---|---|---|---|")
    for r in bench.rows:
        target = "-" if r["target"] is None else f"<= {r['target']:g}x"
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        print(
            f"| {r['name']} | {r['relaunch']:.3f} s | {r['peer_name']} {r['peer']:.3f} s "
            f"| {r['ratio']:.2f}x | {target} | {met} |"
        )


if __name__ == "__main__":
    main()
