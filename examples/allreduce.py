"""The demo: four PyTorch processes rendezvous through `relaunch store serve`.

Starts the store, launches 4 worker processes with the environment torchrun
would give them (MASTER_ADDR/MASTER_PORT pointing at the store and
TORCHELASTIC_USE_AGENT_STORE=True, so no rank starts a store of its own),
runs a gloo all_reduce, and shows the keys torch left in the store.

    python examples/allreduce.py [--nproc 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time


def worker() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env:// rendezvous through the store
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    print(f"rank {rank}/{world}: all_reduce(rank + 1) = {t.item():g} (expected {expected:g})")
    dist.destroy_process_group()
    sys.exit(0 if t.item() == expected else 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="worker processes (default 4)")
    args = parser.parse_args()

    from relaunch import Store
    from relaunch._subprocess import StoreProcess

    with StoreProcess("127.0.0.1", 0, echo=True) as store:
        print(f"store: relaunch store serve on {store.host}:{store.port}")
        started = time.monotonic()
        workers = []
        for rank in range(args.nproc):
            env = dict(
                os.environ,
                MASTER_ADDR=store.host,
                MASTER_PORT=str(store.port),
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(args.nproc),
                TORCHELASTIC_USE_AGENT_STORE="True",
                OMP_NUM_THREADS="1",
            )
            workers.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
        codes = [w.wait() for w in workers]
        elapsed = time.monotonic() - started
        keys = sorted(Store(store.host, store.port, timeout=10).list_keys())
        print(f"store: torch left {len(keys)} keys, e.g. {keys[:4]}")
    if any(codes):
        print(f"demo FAILED: worker exit codes {codes}")
        return 1
    print(f"demo OK: {args.nproc} processes rendezvoused and all-reduced in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
