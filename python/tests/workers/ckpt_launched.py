"""A job under ``relaunch run`` that checkpoints through the launcher's store
(found through ``RELAUNCH_STORE``, no ``store=``).

Usage: ckpt_launched.py DIR. Saves when ``save_every=3`` says so, and at step
4 because rank 1 forces it; in attempt 0, rank 0 SIGKILLs itself at step 7,
so the launcher restarts both ranks, which resume from ``latest()``. Each
rank appends ``attempt step`` to ``DIR/../saved.RANK`` for every save.
"""

import os
import signal
import sys
from pathlib import Path

import relaunch

directory = Path(sys.argv[1])
rank, attempt = int(os.environ["RANK"]), int(os.environ["RELAUNCH_ATTEMPT"])
ckpt = relaunch.Checkpointer(directory, keep_last=None, save_every=3, timeout=60)
latest = ckpt.latest(verify="full")
for step in range(latest.step + 1 if latest else 0, 10):
    if attempt == 0 and step == 7 and rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    with ckpt.save(step, force=rank == 1 and step == 4) as path:
        if path is not None:
            (path / f"rank{rank}.txt").write_text(f"{attempt} {step}\n")
            with open(directory.parent / f"saved.{rank}", "a") as f:
                f.write(f"{attempt} {step}\n")
