"""A child forked by :mod:`multiprocessing` that deadlocks before it runs a
line of Python is killed and forked again.

Before Python 3.11.10 (3.10.15 on 3.10), a child forked while another thread
of the parent was creating a Python thread state inherits the interpreter's
runtime lock held and blocks on it forever, inside ``os.fork()`` (CPython
gh-112275). Native threads create a thread state each time they call into
Python, and torch's gloo threads do after collectives whose tensors Python
has let go of (pybind11 takes the GIL to drop them). So a DDP job on gloo
whose DataLoader forks its workers at every epoch now and then gets a worker
that never starts, and its rank waits for that worker's batch forever.

Installed (by :mod:`relaunch.preemption`, on the Pythons that have the bug),
the fork start method waits after each fork until the child has come
through: an after-fork hook in the child writes its pid to a pipe. A child
that sleeps on a lock (a futex, as ``/proc`` shows) before it gets there
cannot wake up, since it is the only thread of its process. It is killed and
the fork is made again, up to :data:`ATTEMPTS` times; the first try costs
the parent the child's start, about a millisecond.
"""

from __future__ import annotations

import multiprocessing.popen_fork
import os
import platform
import select
import signal
import sys
import time

ATTEMPTS = 5
"""Forks of one process before the start fails with an error."""
PATIENCE = 60.0
"""Seconds the parent waits for a child that is neither through nor stuck
(a machine under heavy load) before it lets it be."""
STUCK_FOR = 0.3
"""Seconds a child must sleep on a futex, without having come through, to be stuck."""
_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())

_beacon: tuple[int, int] | None = None
"""The pipe a guarded fork's child writes its pid to (read end, write end)."""


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether this Python's fork can deadlock its child (gh-112275)."""
    return version < (3, 10, 15) or (3, 11) <= version < (3, 11, 10)


def _came_through() -> None:
    """After-fork hook in the child: tells the parent this child got to Python."""
    global _beacon
    pipe, _beacon = _beacon, None
    if pipe is None:
        return
    read_end, write_end = pipe
    try:
        os.write(write_end, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    finally:
        os.close(read_end)
        os.close(write_end)


def _state(pid: int) -> str | None:
    """The process state letter from ``/proc`` (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :][:1].decode() or None


def _on_futex(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        wchan = ""
    if "futex" in wchan:
        return True
    if wchan not in ("", "0") or _FUTEX is None:
        return False
    try:  # wchan hidden by the kernel: the system call the process is in
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split(" ", 1)[0] == str(_FUTEX)
    except (OSError, IndexError):
        return False


def _wait_for(pid: int, read_end: int) -> bool:
    """Whether the child ``pid`` came through (or ended on its own), rather
    than being stuck before its first line of Python."""
    poller = select.poll()
    poller.register(read_end, select.POLLIN)
    received = b""
    started = time.monotonic()
    blocked_since: float | None = None
    while time.monotonic() - started < PATIENCE:
        if poller.poll(50):
            chunk = os.read(read_end, 64)
            if not chunk:  # every writer closed: the child ended without a word
                return True
            received += chunk
            if str(pid).encode() in received.split(b"\n"):
                return True
            continue
        state = _state(pid)
        if state is None or state in "ZX":
            return True
        if state == "S" and _on_futex(pid):
            now = time.monotonic()
            blocked_since = blocked_since if blocked_since is not None else now
            if now - blocked_since >= STUCK_FOR:
                return False
        else:
            blocked_since = None
    return True


def install() -> None:
    """Guards multiprocessing's fork start method (once; nothing on a Python
    without the bug)."""
    launch = multiprocessing.popen_fork.Popen._launch
    if not affected() or getattr(launch, "_relaunch_guard", False):
        return

    def _launch(self: multiprocessing.popen_fork.Popen, process_obj: object) -> None:
        global _beacon
        for attempt in range(1, ATTEMPTS + 1):
            read_end, write_end = os.pipe()
            _beacon = (read_end, write_end)
            try:
                launch(self, process_obj)  # the child never returns from here
            finally:
                _beacon = None
                os.close(write_end)
            try:
                through = _wait_for(self.pid, read_end)
            finally:
                os.close(read_end)
            if through:
                return
            stuck = self.pid
            os.kill(stuck, signal.SIGKILL)
            os.waitpid(stuck, 0)
            if self.finalizer is not None:
                self.finalizer()  # the sentinel pipe of the child that never ran
            self.finalizer = None
            sys.stderr.write(
                f"relaunch: a process forked by multiprocessing (pid {stuck}) deadlocked "
                f"before it started (CPython gh-112275, fixed in Python 3.11.10); killed it "
                f"and forked again ({attempt} of {ATTEMPTS})\n"
            )
            sys.stderr.flush()
        raise RuntimeError(
            f"{ATTEMPTS} processes forked in a row deadlocked before they started "
            "(CPython gh-112275): upgrade Python to 3.11.10 or later, or use the 'spawn' "
            "or 'forkserver' start method (DataLoader(multiprocessing_context=...))"
        )

    _launch._relaunch_guard = True  # type: ignore[attr-defined]
    multiprocessing.popen_fork.Popen._launch = _launch  # type: ignore[method-assign]
    os.register_at_fork(after_in_child=_came_through)
