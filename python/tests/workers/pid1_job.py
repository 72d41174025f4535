"""A worker for the PID 1 test: steps in lockstep with the other ranks (a
gloo all-reduce per step, as a training loop does) until
`relaunch.preemption` says stop, writing each step to OUT/steps.RANK; at
step 3 rank 0 starts a daemon (double fork, a session of its own) that
writes OUT/daemon.exited and exits a moment later, leaving an orphan for
PID 1 to reap.

Usage: pid1_job.py OUT
"""

from __future__ import annotations

import os
import sys
import time

from relaunch import preemption


def start_daemon(out: str) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(0.5)
            with open(os.path.join(out, "daemon.exited"), "w") as f:
                f.write(str(os.getpid()))
            os._exit(0)
        os._exit(0)
    os.wait()  # the first child; the grandchild is now PID 1's


def main() -> None:
    import torch
    import torch.distributed as dist

    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    step = 0
    while True:
        dist.all_reduce(torch.ones(1))
        with open(os.path.join(out, f"steps.{rank}"), "a") as f:
            f.write(f"{step}\n")
        if rank == 0 and step == 3:
            start_daemon(out)
        if preemption.reached(step):
            with open(os.path.join(out, f"stopped.{rank}"), "w") as f:
                f.write(str(step))
            dist.destroy_process_group()
            sys.exit(0)
        step += 1
        time.sleep(0.1)


if __name__ == "__main__":
    main()
