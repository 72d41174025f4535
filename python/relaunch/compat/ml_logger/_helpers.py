"""``ping``, ``shell`` and ``memoize``: ml-logger's helpers that talked to its
server, as relaunch does them.

``ping(status, interval)``
    ml-logger wrote a ``__presence`` file on its server every ``interval``
    and returned the signals sent to the job since the last call. Here a
    new status is an event of the run (``ping``, spooled like every record:
    it never blocks, never raises when the server is away) and each call is
    a progress beat for ``relaunch run``'s hang detection. The signals:
    ``logger.client.send_signal(prefix, signal)`` (from any process) adds a
    file ``__signals/NAME.json`` to that prefix's run, one file a signal
    (so none overwrites another, where ml-logger kept the last one); a
    background thread that the first ``ping`` starts reads and deletes the
    own run's every ``interval`` seconds (120 by default, as ml-logger's)
    until the run is finished, and ``ping`` returns those read since the
    last call, oldest first.
``shell(command, wd)``
    ml-logger ran it in the run's folder: in local mode on this machine, on
    its server only when that was started with ``--shell`` (otherwise
    ``("", "shell commands are disabled...", 1)``). The relaunch server runs
    no commands, so with a server the answer is the disabled one, with what
    to do instead. In local mode the command runs here, in a scratch folder
    holding a copy of the run's files below the prefix (and ``wd``; an
    absolute ``wd`` is that folder of this machine, as in ml-logger):
    what the command changes there is not saved back. The copy is bounded
    (``RELAUNCH_ML_LOGGER_SHELL_MB``, 1024 MiB by default).
``memoize(f)``
    A local cache of ``f``'s results, pickled under ``cache_dir`` as
    ml-logger kept it; the cache file is read back only when it is the one
    this machine wrote (its BLAKE3 recorded, as for ``save_pkl``), else it
    starts empty (said on stderr).
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable

from relaunch import _native
from relaunch import files as _files
from relaunch.errors import TrackingConfigError, TrackingError

from . import _state
from ._names import _parts, _prefix_parts, run_ids
from ._values import _jsonable

SHELL_DISABLED = (
    "shell commands are disabled: the relaunch server runs no commands. Run it where the "
    "files are (download_dir() or download_file() them, or `relaunch` on the server's host)"
)
SHELL_ENV = "RELAUNCH_ML_LOGGER_SHELL_MB"
"""MiB of the run's files that ``shell`` copies in local mode (default 1024)."""
DEFAULT_SHELL_MB = 1024
SIGNALS = "__signals"
"""The folder of a run that holds the signals sent to it, a JSON file each."""
DEFAULT_PING_INTERVAL = 120.0


class _Client:
    """``logger.client``: the part of ml-logger's ``LogClient`` that scripts
    call directly."""

    def __init__(self, logger: _HelpersMixin) -> None:
        self._logger = logger

    def send_signal(self, exp_key: str, signal: object = None) -> str:
        """Sends ``signal`` (JSON-able: ``"stop"``, a dict, ...) to the job
        logging to the prefix ``exp_key`` (from the root): its next ``ping``
        reads it. Returns the signal file's name; raises when the run is not
        on the server (a signal to the own run waits in the upload queue
        while the server is away)."""
        lg = self._logger
        if not isinstance(exp_key, str):
            raise TypeError(f"exp_key must be a str (a prefix), not {type(exp_key).__name__}")
        prefix = "/".join(_prefix_parts(exp_key))
        if not prefix:
            raise TrackingConfigError("send_signal(''): give the prefix of the job's run")
        own = prefix == lg._run_prefix
        run_id = lg._own_id() if own else run_ids(prefix)[1]
        name = f"{SIGNALS}/{time.time_ns():020d}-{os.getpid()}-{random.getrandbits(32):08x}.json"
        lg._upload_bytes(json.dumps(_jsonable(signal)).encode(), own, run_id, name)
        return name


class _Signals:
    """The thread that reads the own run's signals for ``ping`` (see the module doc)."""

    def __init__(self, logger: _HelpersMixin, interval: float) -> None:
        self._logger = weakref.ref(logger)
        self.interval = interval
        self._lock = threading.Lock()
        self._buffer: list = []
        self._told: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="ml-logger-ping", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def take(self) -> list:
        with self._lock:
            out, self._buffer = self._buffer, []
        return out

    def _loop(self) -> None:
        while True:
            logger = self._logger()
            if logger is None or logger._run is None:  # gone, or its run finished
                return
            try:
                self._poll(logger)
            except Exception as e:  # the server away, a bad signal file: try again later
                why = f"{type(e).__name__}: {e}"
                if why not in self._told:
                    self._told.add(why)
                    builtins.print(
                        f"relaunch.compat.ml_logger: ping could not read the job's signals "
                        f"({why}); trying again every {self.interval:g} s",
                        file=sys.stderr,
                    )
            del logger
            time.sleep(self.interval * (1 + (random.random() - 0.5) * 0.1))

    def _poll(self, logger: _HelpersMixin) -> None:
        run_id = logger._own_id()
        api = logger._api()
        names = sorted(
            f["name"] for f in api.files(run_id) or [] if f["name"].startswith(SIGNALS + "/")
        )
        for name in names:
            with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-") as tmp:
                dest = os.path.join(tmp, "signal")
                _files.download(run_id, name, dest, server=logger._server, token=logger._token)
                with open(dest, "rb") as f:
                    data = f.read()
            try:
                value = json.loads(data)
            except ValueError:
                value = None
                builtins.print(
                    f"relaunch.compat.ml_logger: signal {name} of run {run_id} is not JSON; "
                    "skipped (send_signal() writes JSON)",
                    file=sys.stderr,
                )
            api.delete_file(run_id, name)
            if value is not None:
                with self._lock:
                    self._buffer.append(value)


def _mib_env(name: str, default: float) -> int:
    """Bytes from the environment variable ``name``, given in MiB (``default`` when unset)."""
    text = os.environ.get(name, "").strip()
    try:
        mib = float(text) if text else default
    except ValueError:
        mib = -1
    if not mib > 0:
        raise TrackingConfigError(f"{name}={text!r} is not a number of MiB > 0")
    return int(mib * (1 << 20))


def _shell_limit() -> int:
    return _mib_env(SHELL_ENV, DEFAULT_SHELL_MB)


class _Memoized:
    """``f`` with its results cached in the pickle file ``path``."""

    def __init__(self, f: Callable, path: str) -> None:
        self.f = f
        self.path = path
        self.memo: dict | None = None
        functools.update_wrapper(self, f)

    def _load(self) -> dict:
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return {}
        if not _state.trusted(data):
            builtins.print(
                f"relaunch.compat.ml_logger: memoize: {self.path} is not the cache this machine "
                "wrote (its hash is not recorded), so it is not unpickled; starting afresh",
                file=sys.stderr,
            )
            return {}
        memo = pickle.loads(data)
        return memo if isinstance(memo, dict) else {}

    def __call__(self, *args: object, **kwargs: object) -> object:
        if self.memo is None:
            self.memo = self._load()
        key = (args, tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            raise TypeError(
                f"memoize: the arguments of {self.f.__name__} must be hashable to cache its "
                f"results ({args!r}, {kwargs!r})"
            ) from None
        if key not in self.memo:
            self.memo[key] = self.f(*args, **kwargs)
            data = pickle.dumps(self.memo)
            _state.remember(data)
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            temp = f"{self.path}.{os.getpid()}.tmp"
            with open(temp, "wb") as file:
                file.write(data)
            os.replace(temp, self.path)
        return self.memo[key]


class _HelpersMixin:
    """``ping``, ``shell``, ``memoize`` and ``release`` of ``ML_Logger``."""

    def ping(self, status: str = "running", interval: float | None = None) -> list:
        """Records ``status`` (an event ``ping`` of the run when it changed),
        beats for ``relaunch run``'s hang detection, and returns the signals
        sent to the job (``client.send_signal``) that the background poll
        read since the last call, oldest first; ``interval`` sets the poll's
        period (see the module doc). Never blocks or raises when the server
        is away."""
        if not isinstance(status, str):
            raise TypeError(f"status must be a str, not {type(status).__name__}")
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0
        ):
            raise ValueError(f"interval={interval!r} is not a number of seconds > 0")
        _native.heartbeat()
        own, _, _ = self._where()
        if own and self.__dict__.get("_pinged") != status:
            self._ensure_run().event("ping", status, data={"status": status})
            self.__dict__["_pinged"] = status
        signals = self.__dict__.get("_signals")
        if signals is None or not signals.alive():
            if self._root_spec().local is not None:
                self._server  # noqa: B018 (local mode's server, started here, not in the thread)
            left = signals.take() if signals is not None else []
            period = interval or (signals.interval if signals else DEFAULT_PING_INTERVAL)
            signals = _Signals(self, float(period))
            signals._buffer = left
            self.__dict__["_signals"] = signals
        elif interval:
            signals.interval = float(interval)
        return signals.take()

    @property
    def client(self) -> _Client:
        """What scripts used of ml-logger's ``LogClient``: ``send_signal``."""
        return _Client(self)

    def shell(self, command: str, wd: str = "") -> tuple[str, str, int]:
        """``(stdout, stderr, returncode)`` of ``command`` in the run's folder
        (``wd`` below the prefix): with a server, ml-logger's answer without
        ``--shell`` (the relaunch server runs no commands); in local mode,
        run here in a copy of the run's files (see the module doc)."""
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, not {type(command).__name__}")
        if not isinstance(wd, str):
            raise TypeError(f"wd must be a str, not {type(wd).__name__}")
        if self._root_spec().local is None:
            return "", SHELL_DISABLED, 1
        host = self._host_path(wd) if wd else None
        if host is not None:
            return _run_shell(command, host)
        own, sub, run_id = self._where()
        _, below = _parts(wd, "wd")
        base = "/".join([*sub, *below])
        if own:
            self._save_texts(force=True)
            self._fresh(own)
        listed = [
            f
            for f in self._api().files(run_id) or []
            if not base or f["name"].startswith(base + "/")
        ]
        total, limit = sum(f["size"] for f in listed), _shell_limit()
        if total > limit:
            return (
                "",
                f"shell: the {len(listed)} files of run {run_id} below {base or 'its top'!r} "
                f"hold {total} bytes, more than {SHELL_ENV} ({limit} bytes) allows copying; "
                "run it in a folder of your own: download_dir(..., unpack=None), or raise "
                f"{SHELL_ENV}",
                1,
            )
        with tempfile.TemporaryDirectory(prefix="relaunch-ml-logger-shell-") as tmp:
            for f in listed:
                rel = f["name"][len(base) + 1 :] if base else f["name"]
                dest = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                try:
                    _files.download(run_id, f["name"], dest, server=self._server, token=self._token)
                except TrackingError as e:
                    return "", f"shell: copying {f['name']} of run {run_id} failed: {e}", 1
            return _run_shell(command, tmp)

    def _memo_path(self, f: Callable, cache_dir: str, ctx: object) -> str:
        if not callable(f):
            raise TypeError(f"memoize() takes a function, not {f!r}")
        if not isinstance(cache_dir, str | os.PathLike):
            raise TypeError(f"cache_dir must be a path, not {cache_dir!r}")
        where = "\n".join([str(self._root_key()), self._prefix, *map(str, ctx or [])])
        digest = hashlib.sha256(where.encode()).hexdigest()[:32]
        name = f"{digest}.{getattr(f, '__module__', '')}.{getattr(f, '__name__', 'f')}.pkl"
        return os.path.join(os.fspath(cache_dir), name)

    def _root_key(self) -> str:
        try:
            return str(self.root)
        except Exception:  # a root that cannot be resolved still keys a local cache
            return ""

    def memoize(self, f: Callable, cache_dir: str = ".cache", ctx: object = None) -> _Memoized:
        """``f`` with its results cached in a pickle file under ``cache_dir``
        (one file per root, prefix, ``ctx`` and function); see the module doc."""
        return _Memoized(f, self._memo_path(f, cache_dir, ctx))

    def release(self, f: Callable, cache_dir: str = ".cache", ctx: object = None) -> bool:
        """Deletes ``f``'s cache (as ``memoize`` made it); whether there was one."""
        path = self._memo_path(getattr(f, "f", f), cache_dir, ctx)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True


def _run_shell(command: str, cwd: str) -> tuple[str, str, int]:
    if not os.path.isdir(cwd):
        return "", f"shell: {cwd} is not a folder", 1
    done = subprocess.run(
        command, shell=True, cwd=cwd, capture_output=True, text=True, errors="replace"
    )
    return done.stdout, done.stderr, done.returncode
