"""The DCP benchmark: `torch.distributed.checkpoint.save` through
`relaunch.dcp.Writer` (a committed relaunch checkpoint) against DCP's own
`FileSystemWriter` and `FsspecWriter` (fsspec's local file system) writing
the same state to the same disk, same run, as ratios.

    .venv/bin/python bench/dcp/run.py [--repeat 5] [--size-mib 512] [--quick]

One process, world size 1, CPU tensors: a transformer-like state_dict
(float32 blocks, bench/common.py's `gpt_state_dict`). Sides, run
alternately `--repeat` times (the order rotating), each into a fresh
directory, medians kept; `sync` before each sample (untimed):
- `FileSystemWriter`: `dcp.save(state, storage_writer=FileSystemWriter(DIR))`
  (its default `sync_files=True`: every file fsynced);
- `FsspecWriter`: the same through fsspec's local file system;
- `relaunch.dcp.Writer`: `with Writer(ckpt, step) as w: dcp.save(state,
  storage_writer=w)`, timed until the block returns: committed (every file
  hashed with BLAKE3, the manifest written and fsynced, the directory
  renamed, `latest` swapped).
Results go to stdout as a markdown table and to bench/out/dcp.json. The
ratio is relaunch's time over the peer's (lower is better).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import compare, gpt_state_dict, write_result  # noqa: E402

MIB = 1 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int)
    p.add_argument("--size-mib", type=int)
    p.add_argument("--quick", action="store_true", help="64 MiB, 2 repeats")
    p.add_argument("--scratch", type=Path, default=ROOT / "bench" / "out")
    a = p.parse_args()
    a.repeat = a.repeat or (2 if a.quick else 5)
    a.size_mib = a.size_mib or (64 if a.quick else 512)
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "TORCHELASTIC_")) or name in ("RANK", "WORLD_SIZE"):
            del os.environ[name]
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, FsspecWriter

    import relaunch
    import relaunch.dcp

    width = 512 if a.size_mib >= 256 else 256
    state, _ = gpt_state_dict(a.size_mib * MIB, width, torch.Generator())
    size = sum(t.numel() * t.element_size() for t in state.values())
    a.scratch.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="dcp-bench-", dir=a.scratch))
    samples: dict[str, list[float]] = {"relaunch": [], "FileSystemWriter": [], "FsspecWriter": []}
    ckpt = relaunch.Checkpointer(scratch / "relaunch", keep_last=1)
    step = 0

    def plain(writer_type):
        def save(i: int) -> float:
            where = scratch / f"{writer_type.__name__}-{i}"
            began = time.perf_counter()
            dcp.save(state, storage_writer=writer_type(str(where)))
            took = time.perf_counter() - began
            shutil.rmtree(where)
            return took

        return save

    def ours(i: int) -> float:
        nonlocal step
        step += 1
        began = time.perf_counter()
        with relaunch.dcp.Writer(ckpt, step) as writer:
            dcp.save(state, storage_writer=writer)
        return time.perf_counter() - began

    sides = {
        "relaunch": ours,
        "FileSystemWriter": plain(FileSystemWriter),
        "FsspecWriter": plain(FsspecWriter),
    }
    try:
        for i in range(a.repeat):
            names = list(sides)
            for name in names[i % 3 :] + names[: i % 3]:
                os.sync()
                samples[name].append(sides[name](i))
    finally:
        ckpt.close()
        shutil.rmtree(scratch, ignore_errors=True)
    rows = [
        compare(
            f"dcp.save of {size / MIB:.0f} MiB: relaunch.dcp.Writer (committed) vs {peer}",
            samples["relaunch"],
            samples[peer],
            peer,
            None,
            ours_over_theirs=True,
        )
        for peer in ("FileSystemWriter", "FsspecWriter")
    ]
    result = {"repeat": a.repeat, "bytes": size, "rows": rows}
    write_result("dcp.quick" if a.quick else "dcp", result)
    print(f"# dcp benchmark, {os.cpu_count()} CPUs, median of {a.repeat}, torch", torch.__version__)
    print("\n| figure | relaunch | peer | relaunch / peer |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['relaunch']:.2f} s | {r['peer']:.2f} s | {r['ratio']:.2f}x |")
    print("samples:", {k: [round(v, 3) for v in vs] for k, vs in samples.items()})
    print("medians:", {k: round(statistics.median(v), 3) for k, v in samples.items()})


if __name__ == "__main__":
    main()
