"""Shipping committed checkpoints to the tracking server, in the background.

Under ``relaunch run --server`` (``RELAUNCH_SERVER`` and ``RELAUNCH_RUN_ID``
set), the rank that commits a checkpoint ``DIR/step_N`` uploads it as the
run's files ``checkpoints/step_N/NAME`` through the chunk store (chunks the
server has are not sent again, so successive checkpoints cost what changed),
its ``manifest.json`` last: on the server too, a manifest means the
checkpoint is complete. ``relaunch ckpt pull RUN DIR`` brings it back.

Only the newest committed checkpoint waits to be shipped: when commits come
faster than uploads, an older one that was not started is skipped (the
newer one supersedes it). A failed upload is retried with backoff until it
succeeds or a newer checkpoint replaces it. ``Checkpointer.close()`` and
the interpreter's exit wait for the upload in flight (at most
``RELAUNCH_EXIT_TIMEOUT`` seconds, 30 by default), which is what a
preempted job needs: commit on SIGTERM, ship, exit.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
import weakref
from pathlib import Path

from relaunch._native import heartbeat
from relaunch.errors import TrackingError

EXIT_TIMEOUT_ENV = "RELAUNCH_EXIT_TIMEOUT"
DEFAULT_EXIT_TIMEOUT = 30.0
PREFIX = "checkpoints"
_RETRY_MAX = 30.0
# How often a bounded wait beats.
_BEAT_EVERY = 0.25

_live: weakref.WeakSet[Shipper] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hook_installed = False


def exit_timeout() -> float:
    text = os.environ.get(EXIT_TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_EXIT_TIMEOUT
    except ValueError:
        value = DEFAULT_EXIT_TIMEOUT
    return value if math.isfinite(value) and value >= 0 else DEFAULT_EXIT_TIMEOUT


class Shipper:
    """Uploads ``(step, path)`` checkpoints of run ``run`` to ``server``, newest first."""

    def __init__(self, server: str, token: str | None, run: str) -> None:
        self.server, self.token, self.run = server, token, run
        self._cond = threading.Condition()
        self._next: tuple[int, Path] | None = None
        self._busy = False
        self._stopped = False
        self.shipped: int | None = None
        """The newest step shipped whole."""
        self.error: str | None = None
        """The last failure, cleared by the next success."""
        self._thread = threading.Thread(target=self._loop, name="relaunch-ckpt-ship", daemon=True)
        self._thread.start()
        _live.add(self)
        _install_exit_hook()

    def ship(self, step: int, path: Path) -> None:
        """Queues the committed checkpoint ``path`` of ``step``; returns at once."""
        with self._cond:
            self._next = (step, path)
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        """Waits until nothing is queued or in flight; False on timeout.

        A wait with a timeout beats (``relaunch.heartbeat``) every quarter
        second: it ends by itself, so `relaunch run`'s hang detection must
        not take a rank that waits at exit for its upload for a hung one.
        A wait without one does not beat."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._next is not None or self._busy:
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                heartbeat()
                self._cond.wait(min(left, _BEAT_EVERY))
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _loop(self) -> None:
        pause = 1.0
        while True:
            with self._cond:
                while self._next is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                step, path = self._next  # type: ignore[misc]
                self._next = None
                self._busy = True
            try:
                done = self._upload(step, path)
                error = None
            except (TrackingError, OSError) as e:
                done, error = False, f"step {step}: {e}"
            with self._cond:
                self._busy = False
                if done:
                    self.shipped, self.error, pause = step, None, 1.0
                elif error is not None:
                    self.error = error
                    if self._next is None:  # nothing newer: try this one again
                        self._next = (step, path)
                self._cond.notify_all()
            if error is not None:
                print(
                    f"relaunch: cannot ship checkpoint {error}; retrying in {pause:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped, pause)
                pause = min(pause * 2, _RETRY_MAX)

    def _upload(self, step: int, path: Path) -> bool:
        """Uploads one checkpoint; False when it vanished (pruned) before it was shipped."""
        from relaunch.files import upload_file

        try:
            manifest = json.loads((path / "manifest.json").read_bytes())
        except FileNotFoundError:
            return False
        remote = f"{PREFIX}/{path.name}"
        names = sorted(manifest.get("files", {}))
        try:
            for name in names:
                upload_file(
                    path / name, self.run, f"{remote}/{name}", server=self.server, token=self.token
                )
            # Last: the commit marker on the server.
            upload_file(
                path / "manifest.json",
                self.run,
                f"{remote}/manifest.json",
                server=self.server,
                token=self.token,
            )
        except FileNotFoundError:
            return False  # pruned while shipping: a newer checkpoint exists
        return True


def _install_exit_hook() -> None:
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        _hook_installed = True
    atexit.register(_at_exit)


def _at_exit() -> None:
    """Gives uploads in flight the exit timeout to finish; says what is left."""
    timeout = exit_timeout()
    for shipper in list(_live):
        if not shipper.wait(timeout):
            print(
                f"relaunch: a checkpoint was not shipped to {shipper.server} within "
                f"{timeout:g} s ({EXIT_TIMEOUT_ENV}); it stays on local disk",
                file=sys.stderr,
                flush=True,
            )
        shipper.stop()
