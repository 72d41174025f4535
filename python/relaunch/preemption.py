"""Stop a training job cleanly when it is asked to, at one step on every rank.

Under ``relaunch run``, a stop request (SIGTERM from SLURM or Kubernetes,
Ctrl-C, SIGUSR1 when listed in ``--signals-to-handle``) reaches every worker.
Importing this module replaces the default handling of those signals with a
handler that only sets a flag, so a rank inside a collective is never
interrupted. The training loop asks at each step::

    from relaunch import preemption

    for step in range(start, total):
        train_step()
        if preemption.reached(step):
            save_checkpoint(step)
            sys.exit(0)   # the launcher reports "preempted" (exit code 75)

:func:`reached` makes every rank agree, through the launcher's store, on one
stop step, so that all ranks save the same step. The first rank that sees the
request proposes a step a little ahead (enough for the others to hear of it,
judged from the step time); the others adopt it. A background thread waits
on the store, so a request that reaches one node reaches every node within a
round trip, without the training loop polling the network.

Outside ``relaunch run`` (no store), :func:`reached` returns True at the
first step after a signal.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import warnings

from relaunch import _native

__all__ = ["install", "reached", "requested", "stop_step"]

# Store keys, as the launcher writes them (crates/relaunch-launch/src/keys.rs).
_PREEMPT_KEY = "relaunch/{run_id}/workers/preempt"
_STOP_STEP_KEY = "relaunch/{run_id}/workers/stop_step"

# How long a rank may take to hear of a stop request from another rank:
# the proposed stop step is at least this far ahead, in steps.
_DETECTION = 0.25
_MIN_MARGIN = 2

_DEFAULT_SIGNALS = "SIGTERM,SIGUSR1"

_lock = threading.Lock()
_flag = threading.Event()
_state = {
    "installed": False,
    "agreed": None,  # the agreed stop step, once known
    "last_call": None,  # monotonic time of the previous reached() call
    "step_time": None,  # moving average of the time between calls
    "store": None,
}


def _signals() -> list[signal.Signals]:
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE") or _DEFAULT_SIGNALS
    out = []
    for name in names.split(","):
        name = name.strip().upper()
        if not name:
            continue
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None)
        if sig is not None and sig not in (signal.SIGKILL, signal.SIGSTOP):
            out.append(sig)
    return out


def _handler(signum: int, frame: object) -> None:
    if _flag.is_set() and signum == signal.SIGINT:
        # A second Ctrl-C means now.
        raise KeyboardInterrupt
    _flag.set()


def _store_address() -> tuple[str, int, str] | None:
    addr = os.environ.get("RELAUNCH_STORE")
    run_id = os.environ.get("RELAUNCH_RUN_ID")
    if not addr or not run_id:
        return None
    host, _, port = addr.rpartition(":")
    try:
        return host.strip("[]"), int(port), run_id
    except ValueError:
        return None


def _connect() -> tuple[_native.Store, str] | None:
    where = _store_address()
    if where is None:
        return None
    host, port, run_id = where
    # Raw keys: the launcher writes them without torch's "/" prefix.
    return _native.Store(host, port, 30.0, ""), run_id


def _watch() -> None:
    """Waits on the store for a stop request made anywhere in the job."""
    try:
        connected = _connect()
    except Exception as e:  # the job runs on without cross-node requests
        warnings.warn(f"relaunch.preemption cannot reach the store: {e}", stacklevel=1)
        return
    if connected is None:
        return
    store, run_id = connected
    key = _PREEMPT_KEY.format(run_id=run_id)
    while not _flag.is_set():
        try:
            store.wait([key], 3600.0)
        except TimeoutError:
            continue
        except Exception:  # the store went away: the job is ending
            return
        _flag.set()


def install() -> None:
    """Installs the flag-setting signal handlers and starts the store watcher.

    Called when this module is first imported; call it again from the main
    thread if that import happened elsewhere.
    """
    with _lock:
        if _state["installed"]:
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "relaunch.preemption was imported outside the main thread, where signal "
                "handlers cannot be installed; import it from the main thread",
                stacklevel=2,
            )
            return
        for sig in _signals():
            signal.signal(sig, _handler)
        _state["installed"] = True
    if _store_address() is not None:
        threading.Thread(target=_watch, name="relaunch-preemption", daemon=True).start()


def requested() -> bool:
    """Whether this job was asked to stop (on any node)."""
    return _flag.is_set()


def stop_step() -> int | None:
    """The step all ranks agreed to stop at, once one was agreed."""
    return _state["agreed"]


def _stop_store() -> tuple[_native.Store, str] | None:
    if _state["store"] is None:
        _state["store"] = _connect() or False
    return _state["store"] or None


def reached(step: int) -> bool:
    """Call once per step with the current step number; returns True at the
    step where every rank stops (save, then exit 0).

    Cheap when no stop was requested: no network, a clock read and a flag.
    """
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    now = time.monotonic()
    last, avg = _state["last_call"], _state["step_time"]
    if last is not None:
        dt = now - last
        _state["step_time"] = dt if avg is None else 0.8 * avg + 0.2 * dt
    _state["last_call"] = now

    agreed = _state["agreed"]
    if agreed is None:
        if not _flag.is_set():
            return False
        agreed = _agree(step)
        _state["agreed"] = agreed
    if step > agreed:
        warnings.warn(
            f"relaunch.preemption: this rank is at step {step}, past the agreed stop step "
            f"{agreed}; it stops now, so its checkpoint is of a later step than the others'",
            stacklevel=2,
        )
    return step >= agreed


def _agree(step: int) -> int:
    connected = _stop_store()
    if connected is None:
        return step
    store, run_id = connected
    step_time = _state["step_time"] or _DETECTION
    margin = max(_MIN_MARGIN, math.ceil(_DETECTION / max(step_time, 1e-6)))
    # Tell the other nodes, in case the request reached only this one.
    store.compare_set(_PREEMPT_KEY.format(run_id=run_id), b"", b"worker")
    value = store.compare_set(
        _STOP_STEP_KEY.format(run_id=run_id), b"", str(step + margin).encode()
    )
    return int(value)


install()
