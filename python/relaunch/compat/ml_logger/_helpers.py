"""``ping``, ``shell`` and ``memoize``: ml-logger's helpers that talked to its
server, as relaunch does them.

``ping(status)``
    ml-logger wrote a ``__presence`` file on its server every ``interval``
    and returned the signals sent to the job. Here a new status is an event
    of the run (``ping``, spooled like every record: it never blocks, never
    raises when the server is away), each call is a progress beat for
    ``relaunch run``'s hang detection, and the list of signals is always
    empty: relaunch sends a job no signals (stop or restart it through
    ``relaunch run`` / the launcher).
``shell(command)``
    ml-logger ran it on its server when that was started with ``--shell``,
    and otherwise answered ``("", "shell commands are disabled...", 1)``.
    The relaunch server runs no commands: the answer is always the
    disabled one, with what to do instead.
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
import os
import pickle
import sys
from collections.abc import Callable

from relaunch import _native

from . import _state

SHELL_DISABLED = (
    "shell commands are disabled: the relaunch server runs no commands. Run it where the "
    "files are (download_dir() or download_file() them, or `relaunch` on the server's host)"
)


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
        sent to the job: none (an empty list). Never blocks or raises when
        the server is away."""
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
        return []

    def shell(self, command: str, wd: str = "") -> tuple[str, str, int]:
        """``(stdout, stderr, returncode)`` of ``command`` on the server, as
        ml-logger answered without ``--shell``: the relaunch server runs no
        commands, so ``("", why, 1)``."""
        if not isinstance(command, str):
            raise TypeError(f"command must be a str, not {type(command).__name__}")
        return "", SHELL_DISABLED, 1

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
