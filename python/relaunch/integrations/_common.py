"""What the framework integrations share: the run they log to, and the
wait for every rank after a collective save."""

from __future__ import annotations

import atexit
import os
import warnings
from collections.abc import Mapping
from typing import Any

import relaunch
from relaunch.errors import RelaunchError


def barrier() -> None:
    """Every rank of the default process group meets here (nothing without
    one): a framework's save that only rank 0 writes is whole on disk before
    any rank reports it or exits."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


_destroy_registered = False


def destroy_process_group_at_exit() -> None:
    """Destroys the default process group when the interpreter exits, if the
    script left it up, then gives gloo's worker threads a moment.

    torch (2.15, Python 3.11) aborts a process now and then at its exit
    (SIGABRT, "terminate called without an active exception"), which the
    launcher would take for a failed rank: a gloo worker thread drops its
    last reference to a finished collective while the interpreter
    finalizes, that drop takes the GIL, and Python ends a thread that takes
    the GIL then by unwinding it through C++ that may not unwind. Seen here
    about once in 20 exits of a 2-rank job right after its last all-reduce.
    Frameworks leave the group up, and a stop leaves their ``fit()`` or
    ``train()`` before any script's own ``destroy_process_group``."""
    global _destroy_registered
    if _destroy_registered:
        return
    _destroy_registered = True

    def destroy() -> None:
        import time

        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # the exit goes on; torch says what went wrong
                pass
        time.sleep(0.05)

    atexit.register(destroy)


def rank() -> int:
    """This process's global rank (``RANK``, 0 outside a launcher)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def wants_run(server: str | None, offline: bool) -> bool:
    """Whether an integration should open a run: a server was given or
    ``relaunch run --server`` set one, or the caller asked for an offline
    spool. Without any, a training script that merely lists the callback
    logs nowhere and writes no spool into its working directory."""
    return bool(server or os.environ.get("RELAUNCH_SERVER") or offline)


class LazyRun:
    """A ``relaunch.Run`` opened on first use, on the rank that logs."""

    def __init__(self, init_kwargs: Mapping[str, Any]) -> None:
        self._kwargs = dict(init_kwargs)
        self._run: relaunch.Run | None = None
        self._failed = False
        self.config: dict[str, Any] = {}

    @property
    def enabled(self) -> bool:
        return wants_run(self._kwargs.get("server"), bool(self._kwargs.get("offline")))

    def get(self) -> relaunch.Run | None:
        """The run, opened with the config gathered so far; None when logging
        is off or the run cannot be opened (said once)."""
        if self._run is not None or self._failed or not self.enabled:
            return self._run
        try:
            self._run = relaunch.init(config=self.config or None, **self._kwargs)
        except RelaunchError as e:
            self._failed = True
            warnings.warn(f"relaunch: cannot open the run, nothing is logged: {e}", stacklevel=3)
        return self._run

    @property
    def opened(self) -> bool:
        return self._run is not None

    def finish(self, error: str | None = None) -> None:
        if self._run is not None:
            self._run.finish(error=error)
            self._run = None


def numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``values`` that are numbers (plain, numpy or
    one-element tensors); frameworks mix strings and lists into what they
    log, which a metric cannot hold."""
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            out[key] = float(value)
            continue
        item = getattr(value, "item", None)
        if item is not None and getattr(value, "numel", lambda: 1)() == 1:
            try:
                value = item()
            except (TypeError, ValueError, RuntimeError):
                continue
        if isinstance(value, (int, float)):
            out[key] = float(value)
    return out


def plain_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """A framework's config as JSON-like values for ``relaunch.init``: what
    cannot be one (a class, a device, an enum) is its text."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out[str(key)] = plain_config(value)
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[str(key)] = value
        elif isinstance(value, (list, tuple)) and all(
            v is None or isinstance(v, (bool, int, float, str)) for v in value
        ):
            out[str(key)] = list(value)
        else:
            out[str(key)] = str(value)
    return out
