"""One rank of a multi-process Checkpointer test, agreeing through a
``relaunch store serve`` on 127.0.0.1. Prints one JSON line with what it saw.

Usage: ckpt_rank.py SCENARIO DIR PORT RANK WORLD

- ``agree``: ``save_every=10``; rank 1 forces step 13 (``sync_any`` in
  DIR/any) and step 13 again in DIR/all with ``sync_all``, where every rank
  forces step 14.
- ``die``: step 0 commits; in step 1 rank 2 writes half its file and SIGKILLs
  itself; the others must not commit step 1.
- ``raise``: step 0 commits; rank 1 raises inside step 1's block; step 2
  commits on every rank again; then rank 2 calls save(4) where the others
  call save(3), and step 5 commits again.
"""

import json
import os
import signal
import sys
from pathlib import Path

import relaunch


def write(path: Path, rank: int, step: int) -> None:
    (path / f"rank{rank}.bin").write_bytes(f"rank {rank} step {step}\n".encode() * (100 + rank))


def save(ckpt: relaunch.Checkpointer, step: int, rank: int, force: bool = False) -> bool:
    with ckpt.save(step, force=force) as path:
        if path is None:
            return False
        write(path, rank, step)
    return True


def main() -> None:
    scenario, directory, port, rank, world = sys.argv[1:]
    rank, world = int(rank), int(world)
    store = relaunch.Store("127.0.0.1", int(port), timeout=30)
    # Every rank started: "die" times its saves out after 3 s, less than a
    # loaded machine may take to start three interpreters.
    store.barrier(f"started/{scenario}/{directory}", world, timeout=30)
    root = Path(directory)
    out: dict = {"rank": rank}

    def checkpointer(sub: str, **kwargs: object) -> relaunch.Checkpointer:
        return relaunch.Checkpointer(
            root / sub, store=store, rank=rank, world_size=world, keep_last=None, **kwargs
        )

    if scenario == "agree":
        ckpt = checkpointer("any", save_every=10)
        out["any"] = [s for s in range(25) if save(ckpt, s, rank, force=rank == 1 and s == 13)]
        ckpt = checkpointer("all", save_every=10, strategy="sync_all")
        out["all"] = [
            s for s in range(15) if save(ckpt, s, rank, force=(rank == 1 and s == 13) or s == 14)
        ]
    elif scenario == "die":
        ckpt = checkpointer("die", timeout=3)
        save(ckpt, 0, rank)
        try:
            with ckpt.save(1) as path:
                if rank == 2:
                    with open(path / "rank2.bin", "wb") as f:
                        f.write(b"half of it")
                        f.flush()
                        os.kill(os.getpid(), signal.SIGKILL)
                write(path, rank, 1)
        except relaunch.CheckpointError as e:
            out["error"] = str(e)
    elif scenario == "raise":
        ckpt = checkpointer("raise", timeout=20)
        save(ckpt, 0, rank)
        try:
            with ckpt.save(1) as path:
                if rank == 1:
                    raise RuntimeError("out of disk space (simulated)")
                write(path, rank, 1)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        out["saved_2"] = save(ckpt, 2, rank)
        try:
            save(ckpt, 3 + (rank == 2), rank)
        except ValueError as e:
            out["mismatch"] = str(e)
        out["saved_5"] = save(ckpt, 5, rank)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
