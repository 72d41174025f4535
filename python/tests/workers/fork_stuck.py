"""A DataLoader with forked workers, some of whose forks deadlock in the
child before Python runs, as CPython gh-112275 leaves them.

The deadlock is made the same way every time: an after-fork hook, registered
before relaunch is imported, blocks the first STUCK children on a lock that
nothing in them can release (a futex wait, as the runtime lock is). With
``always`` every child sticks and a plain Process start is tried instead.

    fork_stuck.py STUCK [always]

Prints ``samples`` and the sorted samples each epoch saw, then ``ok``.
"""

from __future__ import annotations

import os
import sys
import threading

STUCK = int(sys.argv[1])
ALWAYS = sys.argv[2:] == ["always"]
forks = 0


def count() -> None:
    global forks
    forks += 1


def stick() -> None:
    # forks is the parent's count, copied into this child.
    if ALWAYS or forks <= STUCK:
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # never returns: this process has one thread


os.register_at_fork(before=count, after_in_child=stick)

import multiprocessing  # noqa: E402

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import relaunch.preemption  # noqa: E402, F401  (installs the guard)


def nothing() -> None:
    pass


if ALWAYS:
    process = multiprocessing.get_context("fork").Process(target=nothing)
    try:
        process.start()
    except RuntimeError as e:
        print(f"refused: {e}", flush=True)
        sys.exit(0)
    sys.exit("the start did not fail")

loader = DataLoader(list(range(20)), batch_size=3, num_workers=2, multiprocessing_context="fork")
for _epoch in range(2):
    seen = sorted(int(x) for batch in loader for x in batch)
    print("samples", *seen, flush=True)
print("ok", torch.__version__, flush=True)
