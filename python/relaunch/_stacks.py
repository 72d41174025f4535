"""Where a rank is, when ``relaunch run`` asks: ``import relaunch`` in a
worker of ``relaunch run`` registers :mod:`faulthandler` on a real-time
signal, so that on a hang the launcher can have the rank write every
thread's Python stack to ``stacks.txt`` in its log directory, even while
its main thread is blocked in C code (a collective, a lock).

The handler is C code that runs in the signal handler itself, without the
GIL, and touches no Python state; it does not chain to, or replace, any
handler of the signals that stop a job (SIGTERM, SIGINT, SIGUSR1, SIGUSR2).
Only the first process of the rank to import relaunch registers (its
DataLoader workers import it again); the beat record tells the launcher
which process that is and which signal, so nothing else is ever sent it.
"""

from __future__ import annotations

import os
import signal

from relaunch import _native

# SIGRTMIN + 7: clear of glibc's own (32, 33) and of the first real-time
# signals that other libraries take.
SIGNAL = signal.SIGRTMIN + 7

_file = None


def install() -> bool:
    """Registers the dump under ``relaunch run``; returns whether this
    process did (False elsewhere, and when it already had)."""
    global _file
    beat_file = os.environ.get("RELAUNCH_BEAT_FILE")
    if _file is not None or not beat_file:
        return False
    import faulthandler

    log_dir = os.environ.get("RELAUNCH_LOG_DIR") or os.path.dirname(beat_file)
    try:
        # Kept open for the life of the process: faulthandler writes to it.
        out = open(os.path.join(log_dir, "stacks.txt"), "a")
    except OSError:
        return False
    try:
        faulthandler.register(SIGNAL, file=out, all_threads=True, chain=False)
    except (RuntimeError, ValueError, OSError):
        out.close()
        return False
    # Only once the handler is in place: the launcher sends the signal to
    # whatever process the record names.
    if not _native.claim_stack_signal(os.getpid(), SIGNAL):
        faulthandler.unregister(SIGNAL)
        out.close()
        return False
    _file = out
    return True


# How long a rank's exit beats at most: an interpreter that takes longer to
# finish after its script ended is stuck, and the hang detection says so.
EXIT_BEATS_SECONDS = 60.0


def beat_at_exit() -> None:
    """Beats, from a native thread, while this rank's interpreter finishes
    after its script ended (at most :data:`EXIT_BEATS_SECONDS`): the
    finalization of a large heap of modules takes seconds on a loaded
    machine, and a finished rank is not a hung one. Registered to run
    first at exit (``threading``'s exit hooks run before the wait for
    threads and the ``atexit`` functions); a no-op outside ``relaunch
    run`` and in every process but the rank's own (a DataLoader worker)."""
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(_native.beat_while_exiting, EXIT_BEATS_SECONDS)
    except RuntimeError:  # the interpreter is already shutting down
        pass
