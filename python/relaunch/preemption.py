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
stop step, so that all ranks save the same step. When it returns True it
also tells the launcher that this rank stopped there, and
:func:`saved` (called by :class:`relaunch.Checkpointer` when it commits the
stop step, and by the framework integrations) that its checkpoint of that
step is written. The launcher exits 75 (preempted: requeue) only when every
rank stopped at the agreed step; workers that exit 0 after a stop signal
without agreeing (a framework's own signal handling, a script that just
exits) get 128 + the signal's number instead, since the work since their
last checkpoint may be lost. The first rank that sees the
request proposes a step a little ahead (enough for the others to hear of it,
judged from the step time); the others adopt it. A background thread waits
on the store, so a request that reaches one node reaches every node within a
round trip, without the training loop polling the network.

Under torchrun the ranks agree the same way through torchrun's own store
(its agent's, at ``MASTER_ADDR:MASTER_PORT``), with keys of the restart.
Under any other launcher (no store), :func:`reached` returns True at the
first step after a signal on the rank that got it, and a job of several
ranks says so once when this module is imported.

A SIGTERM that follows a failure is not a stop request: when a worker of
the attempt fails, or another node failed or was lost, the launcher sets
``relaunch/RUN/workers/failed/ATTEMPT`` and then sends SIGTERM to its
workers. The handler sees that key and ends the
rank by the signal at once, as it would have ended without this module,
so the restart waits on no one (no checkpoint can be agreed with a dead
rank anyway; what was logged is in the local spool). A node taken for lost
(its heartbeats later than the rendezvous' ``keep_alive_timeout``) counts as
failed even when it was only slow: every rank ends at once and what was not
yet saved is lost, so size ``keep_alive_timeout`` above the pauses your
nodes can have. While the job stops for a preemption, nothing counts as a
failure: the ranks finish the stop step they agreed on.

Children started through :mod:`multiprocessing` (DataLoader workers with any
start method: fork, spawn, forkserver; ``persistent_workers``; pools) are
shielded from the same signals: they start with them blocked, so a stop
request sent to every process of the job (SLURM signals every process of a
step; ``kill -TERM -- -PGID``; a container runtime stopping everything) does
not kill them before their rank decides to stop. Left to themselves they
would die of it (torch's DataLoader workers install a SIGTERM handler that
re-raises), and the rank would fail with "DataLoader worker is killed by
signal: Terminated" instead of saving its step. The rank's own shutdown ends
them (the DataLoader stops its workers), and the launcher kills whatever is
left once the rank has exited. ``Process.terminate()`` on a shielded child
sends SIGKILL, since the child would never act on a blocked SIGTERM.
Children started with :mod:`subprocess` are not shielded. On a Python whose
fork can deadlock the child (before 3.11.10, CPython gh-112275), a
multiprocessing child stuck that way is killed and forked again
(:mod:`relaunch._fork_guard`).
"""

from __future__ import annotations

import atexit
import gc
import json
import math
import multiprocessing.popen_fork
import multiprocessing.process
import os
import signal
import sys
import threading
import time
import warnings

from relaunch import _fork_guard, _native
from relaunch._checkpoint_agree import failed_key

__all__ = ["install", "reached", "requested", "saved", "stop_step"]

# Store keys, as the launcher writes them (crates/relaunch-launch/src/keys.rs).
_PREEMPT_KEY = "relaunch/{run_id}/workers/preempt"
_STOP_STEP_KEY = "relaunch/{run_id}/workers/stop_step"
# This rank's stop, for the launcher's exit code: JSON {"step", "agreed",
# "checkpoint"}.
_STOPPED_KEY = "relaunch/{run_id}/workers/stopped/{rank}"

# How long a rank may take to hear of a stop request from another rank:
# the proposed stop step is at least this far ahead, in steps.
_DETECTION = 0.25
_MIN_MARGIN = 2

_DEFAULT_SIGNALS = "SIGTERM,SIGUSR1"

_lock = threading.Lock()
_state = {
    "installed": False,
    # Set by a stop signal or the store watcher, never cleared. A plain
    # value, not a threading.Event: the signal handler must take no lock.
    "requested": False,
    "in_handler": False,  # the signal handler is asking the store
    "agreed": None,  # the agreed stop step, once known
    "deferred": False,  # the agreed step fell inside an accumulation cycle
    "last_call": None,  # monotonic time of the previous reached() call
    "step_time": None,  # moving average of the time between calls
    "store": None,
    "interrupts": 0,  # SIGINTs received
    "failure_store": None,  # the connection that checks for a failed rank
    "stopped": None,  # this rank's stop report, once reached() returned True
    "saved": {},  # step -> where this rank's checkpoint of it is (saved())
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
    # Python runs a handler between two bytecodes of whatever the main thread
    # was running, this handler included: the same signal sent twice (by the
    # scheduler to every process, and forwarded by the launcher) runs one
    # handler inside the other. So it takes no lock (a nested one would wait
    # forever on the lock the outer one holds) and does its one slow thing,
    # asking the store about a failure, once at a time.
    if signum == signal.SIGINT:
        # A second Ctrl-C means now. Counted, not read from the flag: the
        # store may have set the flag before the launcher's forwarded
        # SIGINT (the first one) arrives here.
        _state["interrupts"] += 1
        if _state["interrupts"] > 1:
            raise KeyboardInterrupt
    elif not _state["in_handler"]:
        _state["in_handler"] = True
        try:
            failure = _attempt_failed()
            if failure is not None:
                _end_now(signum, failure)
        finally:
            _state["in_handler"] = False
    _state["requested"] = True


def _attempt_failed() -> str | None:
    """What the launcher's ``workers/failed`` key says, if it is set.

    The launcher sets it when a worker of the attempt fails, or another node
    failed or was lost, before it sends SIGTERM to its workers: that SIGTERM
    is not a stop request to agree on (no checkpoint can be agreed with a
    dead rank) but the end of the attempt. Bounded: a store that does not
    answer within 2 s counts as not set, and the signal is a stop request as
    before.
    """
    where, key = _store_address(), failed_key()
    if where is None or key is None:
        return None
    host, port, _ = where
    try:
        if _state["failure_store"] is None:
            _state["failure_store"] = _native.Store(host, port, 2.0, "")
        store = _state["failure_store"]
        if not store.check([key]):
            return None
        return store.get(key).decode(errors="replace").strip()
    except Exception:  # the store went away: no news of a failure
        return None


def _end_now(signum: int, failure: str) -> None:
    """Ends this process by ``signum``, as it would have without this module
    (and as torchrun's workers do): its peers, the launcher and the restart
    wait on nothing. What was logged is already in the local spool; a
    checkpoint being written is not committed (it needs every rank)."""
    name = signal.Signals(signum).name
    try:
        sys.stderr.write(
            f"relaunch.preemption: {name} after a failure in this attempt ({failure}); "
            "ending this rank now for the restart\n"
        )
        sys.stderr.flush()
    except Exception:
        pass
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)


# Pids of the multiprocessing children started with the stop signals blocked.
_shielded: set[int] = set()


def _shield_multiprocessing(signals: list[signal.Signals]) -> None:
    """Makes multiprocessing children start with ``signals`` blocked.

    A blocked signal mask survives fork and exec, so it reaches the children
    of every start method; the rank itself keeps them unblocked.
    """
    base = multiprocessing.process.BaseProcess
    if getattr(base.start, "_relaunch_shield", False):
        return
    original_start = base.start
    original_terminate = multiprocessing.popen_fork.Popen.terminate

    def start(self: multiprocessing.process.BaseProcess) -> None:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            original_start(self)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if self.pid is not None:
            _shielded.add(self.pid)

    # Every start method's Popen derives from popen_fork's, and both
    # Process.terminate and multiprocessing's exit handler (for daemonic
    # children such as DataLoader workers) end in its terminate.
    def terminate(self: multiprocessing.popen_fork.Popen) -> None:
        if self.pid in _shielded and signal.SIGTERM in signals:
            # SIGTERM is blocked in the child and would stay pending forever.
            self.kill()
        else:
            original_terminate(self)

    start._relaunch_shield = True  # type: ignore[attr-defined]
    base.start = start  # type: ignore[method-assign]
    multiprocessing.popen_fork.Popen.terminate = terminate  # type: ignore[method-assign]
    _fork_guard.install()
    # Registered after multiprocessing's own exit handler, so it runs first.
    atexit.register(_shut_down_loaders)


def _shut_down_loaders() -> None:
    """Stops the workers of every live DataLoader iterator the way the
    iterator itself does when it is deleted (a sentinel on each worker's
    queue, then join), before multiprocessing's exit handler would
    terminate them: a rank that stops mid-epoch exits with its workers
    ended cleanly, not killed."""
    torch_loader = sys.modules.get("torch.utils.data.dataloader")
    if torch_loader is None or not _shielded:
        return
    iterator = getattr(torch_loader, "_MultiProcessingDataLoaderIter", None)
    if iterator is None:
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), iterator):
            try:
                obj._shutdown_workers()
            except Exception:  # multiprocessing's exit handler ends the rest
                pass


def _store_address() -> tuple[str, int, str] | None:
    """Where the ranks agree: ``relaunch run``'s store, else torchrun's (its
    agent's TCPStore at ``MASTER_ADDR:MASTER_PORT``, the one
    ``init_process_group`` uses, up before the workers start), with keys
    of this run and, under torchrun, of this restart (its store outlives a
    restart, and an earlier attempt's request must not stop the next)."""
    addr = os.environ.get("RELAUNCH_STORE")
    run_id = os.environ.get("RELAUNCH_RUN_ID")
    if addr and run_id:
        host, _, port = addr.rpartition(":")
    elif _under_torchrun():
        host, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        run_id = f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}-{restart}"
    else:
        return None
    try:
        return host.strip("[]"), int(port), run_id
    except ValueError:
        return None


def _under_torchrun() -> bool:
    return all(
        os.environ.get(name) for name in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
    )


def _say_if_alone() -> None:
    """Several ranks and no store to agree through (another launcher than
    ``relaunch run`` or torchrun): said once, at start, since a stop
    signal that reaches one rank then stops that rank alone, and the others
    wait for it in their next collective."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        world = 1
    if world > 1 and _store_address() is None and os.environ.get("RANK", "0") == "0":
        warnings.warn(
            f"relaunch.preemption: {world} ranks but no store to agree on a stop step through "
            "(neither relaunch run's RELAUNCH_STORE nor torchrun's MASTER_ADDR/MASTER_PORT "
            "with TORCHELASTIC_RUN_ID): each rank stops at its own step, and a stop signal "
            "that reaches one rank only leaves the others waiting for it; launch with "
            "relaunch run (or torchrun)",
            stacklevel=3,
        )


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
    while not _state["requested"]:
        try:
            store.wait([key], 3600.0)
        except TimeoutError:
            continue
        except Exception:  # the store went away: the job is ending
            return
        _state["requested"] = True


def install() -> None:
    """Installs the flag-setting signal handlers and starts the store watcher.

    Called when this module is first imported. Call it again from the main
    thread if that import happened elsewhere, or to take the stop signals
    back from a framework that replaced the handlers since (relaunch's
    integrations do, when Lightning installs its own at ``fit()``).
    """
    with _lock:
        if threading.current_thread() is not threading.main_thread():
            if not _state["installed"]:
                warnings.warn(
                    "relaunch.preemption was imported outside the main thread, where signal "
                    "handlers cannot be installed; import it from the main thread",
                    stacklevel=2,
                )
            return
        signals = _signals()
        for sig in signals:
            if signal.getsignal(sig) is not _handler:
                signal.signal(sig, _handler)
        if _state["installed"]:
            return
        _shield_multiprocessing(signals)
        _state["installed"] = True
    if _store_address() is not None:
        threading.Thread(target=_watch, name="relaunch-preemption", daemon=True).start()
    else:
        _say_if_alone()


def requested() -> bool:
    """Whether this job was asked to stop (on any node)."""
    return _state["requested"]


def stop_step() -> int | None:
    """The step all ranks agreed to stop at, once one was agreed."""
    return _state["agreed"]


def _stop_store() -> tuple[_native.Store, str] | None:
    if _state["store"] is None:
        _state["store"] = _connect() or False
    return _state["store"] or None


def reached(step: int, *, boundary: bool = True) -> bool:
    """Call once per step with the current step number; returns True at the
    step where every rank stops (save, then exit 0).

    With gradient accumulation, pass ``boundary=False`` for the batches
    after which the optimizer did not step (inside an accumulation cycle):
    the stop is then at the first boundary at or after the agreed step, so
    no accumulated gradient is lost. Every rank must see the same boundaries
    (they do when the ranks run one loop over equal shares of the data).

    Cheap when no stop was requested: no network, a clock read and a flag.
    """
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    if not isinstance(boundary, bool):
        raise TypeError(f"boundary must be a bool, not {type(boundary).__name__}")
    _native.heartbeat(step)
    now = time.monotonic()
    last, avg = _state["last_call"], _state["step_time"]
    if last is not None:
        dt = now - last
        _state["step_time"] = dt if avg is None else 0.8 * avg + 0.2 * dt
    _state["last_call"] = now

    agreed = _state["agreed"]
    if agreed is None:
        if not _state["requested"]:
            return False
        agreed = _agree(step)
        _state["agreed"] = agreed
    if step < agreed:
        return False
    if not boundary:
        _state["deferred"] = True  # to the end of this accumulation cycle
        return False
    if step > agreed and not _state["deferred"]:
        warnings.warn(
            f"relaunch.preemption: this rank is at step {step}, past the agreed stop step "
            f"{agreed}; it stops now, so its checkpoint is of a later step than the others'",
            stacklevel=2,
        )
    if _state["stopped"] is None:
        checkpoint = _state["saved"].get(step)
        _state["stopped"] = {"step": step, "agreed": agreed, "checkpoint": checkpoint}
        _report_stop()
    return True


def saved(checkpoint: str | os.PathLike[str] | None = None, step: int | None = None) -> None:
    """Tells the launcher that this rank's checkpoint of the stop step is
    written; ``checkpoint`` says where (for the launcher's last line),
    ``step`` which step it holds (default: the agreed stop step).

    Call it once the checkpoint is complete, before or after :func:`reached`
    returned True for that step; :class:`relaunch.Checkpointer` and the
    framework integrations call it themselves. A checkpoint of another step
    than the one this rank stops at does not count.
    """
    if step is None:
        step = _state["agreed"]
    if step is None:
        return
    where = os.fspath(checkpoint) if checkpoint is not None else ""
    _state["saved"] = {step: where}
    stopped = _state["stopped"]
    if stopped is not None and stopped["step"] == step:
        stopped["checkpoint"] = where
        _report_stop()


def _report_stop() -> None:
    """Writes this rank's stop report where the launcher reads it when the
    attempt ends. Bounded and quiet: a store that is gone means a launcher
    that no longer asks."""
    connected = _stop_store()
    rank = os.environ.get("RANK")
    if connected is None or rank is None:
        return
    store, run_id = connected
    try:
        store.set(
            _STOPPED_KEY.format(run_id=run_id, rank=rank),
            json.dumps(_state["stopped"]).encode(),
        )
    except Exception as e:  # the launcher then reports this rank as not stopped
        warnings.warn(f"relaunch.preemption cannot report this rank's stop: {e}", stacklevel=3)


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
