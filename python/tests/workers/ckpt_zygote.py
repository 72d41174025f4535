"""Forks checkpoint save loops on request, so that a test can SIGKILL one
every few milliseconds without paying for a fresh interpreter and torch
import each time.

stdin, one line per child: ``DIR``. stdout: ``pid PID`` when the child
starts, ``committed STEP`` from the child after each commit returned, and
``reaped PID`` once the child is dead (so every line the child wrote comes
before it).

Each child resumes from ``Checkpointer(DIR).latest()`` and saves forever,
alternating a three-file ``with ckpt.save(step)`` block and ``save_async``,
with ``keep_last=1``.
"""

import os
import sys

import torch

import relaunch

torch.set_num_threads(1)
ELEMENTS = 1 << 16


def state(step: int) -> dict:
    return {"step": step, "w": torch.full((ELEMENTS,), float(step)), "b": torch.arange(257) + step}


def save_forever(directory: str) -> None:
    ckpt = relaunch.Checkpointer(directory, keep_last=1)
    latest = ckpt.latest()
    step = latest.step + 1 if latest is not None else 0
    while True:
        if step % 2:
            ckpt.save_async(state(step), step, metadata={"kind": "async"})
            ckpt.wait()
        else:
            with ckpt.save(step, metadata={"kind": "sync"}) as path:
                torch.save(state(step), path / "model.pt")
                torch.save({"step": step, "m": torch.ones(ELEMENTS // 2) * step}, path / "optim.pt")
                (path / "rng").mkdir()
                (path / "rng" / "state.bin").write_bytes(bytes([step % 251]) * (4096 + step))
        # One write(2) of less than PIPE_BUF: whole, whenever the kill lands.
        os.write(1, f"committed {step}\n".encode())
        step += 1


def main() -> None:
    for line in sys.stdin:
        directory = line.strip()
        pid = os.fork()
        if pid == 0:
            try:
                save_forever(directory)
            finally:
                os._exit(1)
        os.write(1, f"pid {pid}\n".encode())
        os.waitpid(pid, 0)
        os.write(1, f"reaped {pid}\n".encode())


if __name__ == "__main__":
    main()
