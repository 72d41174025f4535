"""A job in which a rank dies while the other waits for it in a checkpoint vote.

Usage: ckpt_dead_peer.py DIR. Both ranks handle SIGTERM themselves, as a
script with its own handler does (the launcher's SIGTERM to the survivor then
does not end it). Rank 1 SIGKILLs itself once rank 0 has entered ``save`` (rank 0
writes ``DIR/entered``); rank 0 waits in the vote until the launcher's
``workers/failed`` key tells it rank 1 is gone, then writes what it raised to
``DIR/raised`` with the seconds since rank 1 killed itself (rank 1 writes its
wall clock to ``DIR/killed`` first: its start may come seconds after rank 0's).
"""

import os
import signal
import sys
import time
from pathlib import Path

import relaunch

signal.signal(signal.SIGTERM, lambda signum, frame: None)

directory = Path(sys.argv[1])
rank = int(os.environ["RANK"])
ckpt = relaunch.Checkpointer(directory / "ckpt", keep_last=None, timeout=600)
if rank == 1:
    while not (directory / "entered").exists():
        time.sleep(0.01)
    time.sleep(0.3)
    (directory / "killed").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
(directory / "entered").write_text("")
try:
    with ckpt.save(1, force=True) as path:
        pass
except relaunch.CheckpointError as e:
    waited = time.time() - float((directory / "killed").read_text())
    (directory / "raised").write_text(f"{waited:.3f}\n{e}\n")
    raise
