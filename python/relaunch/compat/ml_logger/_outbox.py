"""Params that could not reach the server: kept on disk and delivered later,
never dropped, never raised into the training loop.

ml-logger posted ``log_params`` (and so every ``job_running()``) from a
thread pool and dropped whatever failed. Here a ``log_params`` of the
logger's own run that fails because the server cannot be reached (refused,
reset, timed out) is queued instead, and returns:

* The queue is one JSON file a run, ``.ml-logger/outbox/RUN.json`` under
  relaunch's client directory (see ``_state``), written atomically and
  shared by the run's processes (a file lock). It holds the run's pending
  params as one deep-merged record: applying it once to the server's config
  gives what applying each ``log_params`` in turn would (ml-logger's merge:
  dicts merge, anything else replaces), so a ``job_running()`` a step does
  not grow it. It is bounded: past ``MAX_PENDING_BYTES`` a ``log_params``
  raises, saying why, rather than fill the disk.
* While something is queued, each ``log_params`` of the run is added to the
  queue too and the queue is applied after it, so a later call never loses
  to an earlier one.
* A thread of this process retries the delivery (after 1 s, doubling to
  30 s); ``Sync()``, ``job_completed()``/``job_errored()`` and a prefix
  switch deliver it first and raise if they cannot (they promise the server
  has everything); interpreter exit tries once more and otherwise says on
  stderr where the params are and how to ship them: the next logger of the
  run does (at its next ``log_params``, ``Sync()`` or ``job_completed()``),
  or ``python -m relaunch.compat.ml_logger.outbox``.

Files of the logger's own run that cannot reach the server go to relaunch's
own crash-safe upload queue instead (``_run_files``).

``ML_Logger`` defines ``log_params``, ``_acknowledged`` (leaving ``Sync()``)
and ``_finish``; :class:`_OutboxMixin`, one of its bases, wraps those three
when the class is made (``__init_subclass__``), so the queue stays out of
their code.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import functools
import json
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator

from relaunch.errors import TrackingConnectionError, TrackingError, TrackingTimeoutError

from . import _state
from ._api import _Api
from ._values import _assign, _namespace

MAX_PENDING_BYTES = 16 << 20
"""The most a run's queued params may take, as JSON."""
RETRY_FIRST = 1.0
RETRY_MOST = 30.0
PENDING_TIMEOUT = 5.0
"""Seconds a ``log_params`` waits for the server while params are queued."""
EXIT_TIMEOUT = 10.0

UNREACHABLE = (TrackingConnectionError, TrackingTimeoutError)

_thread_locks: dict[str, threading.RLock] = {}
_thread_locks_guard = threading.Lock()


def outbox_dir(client_dir: str | None = None) -> str:
    return os.path.join(client_dir or _state.client_dir(), ".ml-logger", "outbox")


class Box:
    """The queued params of one run (a file under :func:`outbox_dir`)."""

    def __init__(self, run_id: str, client_dir: str | None = None) -> None:
        self.run_id = run_id
        self.path = os.path.join(outbox_dir(client_dir), f"{run_id}.json")
        with _thread_locks_guard:
            self._lock = _thread_locks.setdefault(self.path, threading.RLock())

    @contextlib.contextmanager
    def hold(self) -> Iterator[Box]:
        """This process's other threads wait (the run's other processes wait
        only while the file changes: :meth:`add`, :meth:`deliver`)."""
        with self._lock:
            yield self

    def _flock(self) -> contextlib.AbstractContextManager[None]:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return _state.locked(self.path + ".lock")

    def read(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                entry = json.load(f)
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise TrackingError(
                f"{self.path} is not a queue of params ({e}); move it aside to go on (it holds "
                "params that never reached the server)"
            ) from None
        return entry if isinstance(entry, dict) and entry.get("params") else None

    def add(self, server: str, record: dict, error: str | None) -> dict:
        """Merges ``record`` into the queue (written atomically); returns the queue."""
        with self._flock():
            entry = self.read() or {
                "run": self.run_id,
                "server": server,
                "since": time.time(),
                "params": {},
            }
            _assign(entry["params"], record)
            if error:
                entry["error"] = error
            text = json.dumps(entry)
            if len(text) > MAX_PENDING_BYTES:
                raise TrackingError(
                    f"the params of run {self.run_id} waiting for the server take {len(text)} "
                    f"bytes, over {MAX_PENDING_BYTES}: the server ({server}) has not answered "
                    f"since {time.ctime(entry['since'])} ({entry.get('error')}). They are kept "
                    f"in {self.path}; bring the server back, or log fewer params"
                )
            temp = f"{self.path}.{os.getpid()}.tmp"
            with open(temp, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        return entry

    def deliver(self, api: _Api) -> bool:
        """Applies the queue to the run's config on the server and empties it;
        False when the run is not on the server yet (the queue stays).
        Raises what the server answered (a connection error: still away)."""
        if self.read() is None:
            return True
        with self._flock():
            entry = self.read()
            if entry is None:
                return True
            info = api.run(self.run_id)
            if info is None:
                return False
            config = info.get("config")
            merged = _assign(
                copy.deepcopy(config if isinstance(config, dict) else {}), entry["params"]
            )
            api.set_config(self.run_id, merged)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        return True


# --- delivery in the background and at exit ---------------------------------------------


class _Pending:
    """A run whose params wait, with where and how to deliver them."""

    def __init__(self, box: Box, server: str, token: str | None, timeout: float) -> None:
        self.box = box
        self.server = server
        self.token = token
        self.timeout = timeout
        self.loggers: weakref.WeakSet = weakref.WeakSet()
        self.error: str | None = None

    def api(self, timeout: float | None = None) -> _Api:
        return _Api(self.server, self.token, timeout or self.timeout)

    def try_deliver(self, timeout: float | None = None) -> bool:
        with self.box.hold():
            try:
                done = self.box.deliver(self.api(timeout))
            except TrackingError as e:
                self.error = str(e)
                return False
            if done:
                for lg in list(self.loggers):
                    lg._config = None  # read again: the server's config changed under it
            else:
                self.error = f"run {self.box.run_id} is not on the server yet"
            return done


_pending: dict[str, _Pending] = {}
_pending_guard = threading.Lock()
_wake = threading.Event()
_worker: threading.Thread | None = None
_exit_hook = False


def _register(lg: object, box: Box, error: BaseException | None) -> _Pending:
    global _worker, _exit_hook
    server = lg._server  # type: ignore[attr-defined]
    with _pending_guard:
        entry = _pending.get(box.path)
        if entry is None:
            entry = _pending[box.path] = _Pending(box, server, lg._token, lg.timeout)  # type: ignore[attr-defined]
            builtins.print(
                f"relaunch.compat.ml_logger: cannot reach the server for the params of run "
                f"{box.run_id} ({error}); they are kept in {box.path} and delivered once it "
                "answers (in the background; Sync() and job_completed() wait for them)",
                file=sys.stderr,
            )
        entry.loggers.add(lg)
        if error is not None:
            entry.error = str(error)
        if not _exit_hook:
            import atexit

            _exit_hook = True
            atexit.register(_at_exit)
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, name="relaunch-ml-logger-outbox", daemon=True)
            _worker.start()
    return entry


def _work() -> None:
    wait = RETRY_FIRST
    while True:
        _wake.wait(wait)
        _wake.clear()
        with _pending_guard:
            entries = list(_pending.items())
        if not entries:
            return
        for path, entry in entries:
            if entry.try_deliver(min(entry.timeout, 10.0)):
                with _pending_guard:
                    _pending.pop(path, None)
        wait = RETRY_FIRST if len(entries) > len(_pending) else min(wait * 2, RETRY_MOST)


def _forget(box: Box) -> None:
    with _pending_guard:
        _pending.pop(box.path, None)


def _at_exit() -> None:
    with _pending_guard:
        entries = list(_pending.values())
        _pending.clear()
    for entry in entries:
        if entry.box.read() is None or entry.try_deliver(min(entry.timeout, EXIT_TIMEOUT)):
            continue
        builtins.print(
            f"relaunch.compat.ml_logger: run {entry.box.run_id}: params logged while the server "
            f"could not be reached are not delivered ({entry.error}); they are kept in "
            f"{entry.box.path}. The next logger of this run delivers them (at its next "
            "log_params, Sync() or job_completed()), or run: python -m "
            f"relaunch.compat.ml_logger.outbox --server {entry.server} "
            f"{os.path.dirname(os.path.dirname(os.path.dirname(entry.box.path)))}",
            file=sys.stderr,
        )


# --- the wrapped methods --------------------------------------------------------------------


@contextlib.contextmanager
def _patience(lg: object, seconds: float | None) -> Iterator[None]:
    if seconds is None:
        yield
        return
    old = lg.timeout  # type: ignore[attr-defined]
    lg.timeout = min(old, seconds)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        lg.timeout = old  # type: ignore[attr-defined]


def _deliver_now(lg: object, box: Box, what: str) -> None:
    """Delivers ``box`` now (blocking); raises saying why it cannot."""
    with box.hold():
        if box.read() is None:
            _forget(box)
            return
        try:
            done = box.deliver(lg._api())  # type: ignore[attr-defined]
        except TrackingError as e:
            raise type(e)(
                f"{what}: the params of run {box.run_id} logged while the server could not be "
                f"reached are still not delivered ({e}); they are kept in {box.path}"
            ) from None
        if not done:
            raise TrackingError(
                f"{what}: run {box.run_id} is not on the server, so the params queued in "
                f"{box.path} cannot be delivered yet"
            )
        lg._config = None  # type: ignore[attr-defined]
    _forget(box)


def _log_params(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def log_params(self, path: str = "parameters.pkl", silent: bool = False, **namespaces):
        if path not in ("parameters.pkl", None) or not namespaces:
            return original(self, path, silent, **namespaces)
        own, sub, run_id = self._where()
        if not own:
            return original(self, path, silent, **namespaces)
        record: dict = {name: _namespace(value) for name, value in namespaces.items()}
        for part in reversed(sub):
            record = {part: record}
        box = Box(run_id)
        with box.hold():
            queued = box.read() is not None
            if queued:
                box.add(self._server, record, None)
            try:
                with _patience(self, PENDING_TIMEOUT if queued else None):
                    original(self, path, silent, **namespaces)
            except UNREACHABLE as e:
                if not queued:
                    box.add(self._server, record, str(e))
                self._config = None
                _register(self, box, e)
                return None
            if queued:
                try:
                    box.deliver(self._api())
                except UNREACHABLE as e:
                    _register(self, box, e)
                    return None
                self._config = None
        if queued:
            _forget(box)
        return None

    return log_params


def _acknowledged(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def acknowledged(self) -> None:
        _deliver_now(self, Box(self._own_id()), "leaving Sync()")
        original(self)

    return acknowledged


def _finish(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def finish(self, error: str | None) -> None:
        if self._run is not None:
            _deliver_now(self, Box(self._run.id), "finishing the run")
        original(self, error)

    return finish


_WRAPPED = {"log_params": _log_params, "_acknowledged": _acknowledged, "_finish": _finish}


class _OutboxMixin:
    """Wraps ``log_params``, ``_acknowledged`` and ``_finish`` of the class
    that defines them (``ML_Logger``) with the queue above."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        for name, wrap in _WRAPPED.items():
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_outbox", False):
                wrapped = wrap(method)
                wrapped._outbox = True  # type: ignore[attr-defined]
                setattr(cls, name, wrapped)


def deliver_all(client_dir: str | None, server: str | None, token: str | None, timeout: float):
    """Delivers every queue under ``client_dir`` (to ``server``, else the one
    each was meant for); yields (run id, delivered, why not)."""
    folder = outbox_dir(client_dir)
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        box = Box(name[: -len(".json")], client_dir)
        with box.hold():
            entry = box.read()
            if entry is None:
                continue
            target = server or entry.get("server")
            if not target:
                yield box.run_id, False, "no server recorded: pass --server URL"
                continue
            try:
                done = box.deliver(_Api(target, token, timeout))
            except TrackingError as e:
                yield box.run_id, False, str(e)
                continue
            yield box.run_id, done, None if done else f"run {box.run_id} is not on {target}"
