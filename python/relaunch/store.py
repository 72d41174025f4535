"""``relaunch.Store``: a client of the rendezvous store.

It speaks PyTorch's TCPStore protocol, so it works against ``relaunch store
serve`` and against a store started by ``torch.distributed.TCPStore``, and it
shares keys with torch's own client on the same server: ``store.set("k", ...)``
here is ``tcp_store.get("k")`` there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import timedelta

from relaunch import _native

__all__ = ["Store"]

Value = str | bytes | bytearray | memoryview

DEFAULT_TIMEOUT = 300.0
"""PyTorch's default store timeout, in seconds."""


def _seconds(timeout: float | timedelta, name: str = "timeout") -> float:
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"{name} must be seconds (int or float) or a datetime.timedelta, "
            f"not {type(timeout).__name__}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {timeout!r}")
    return seconds


def _key(key: object, what: str = "key") -> str:
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, not {type(key).__name__}: {key!r}")
    return key


def _keys(keys: str | Iterable[str]) -> list[str]:
    if isinstance(keys, str):
        return [keys]
    return [_key(k, "each key") for k in keys]


def _bytes(value: object, what: str = "value") -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, not {type(value).__name__}")


class Store:
    """A connection to a TCPStore-compatible server.

    Every key gets ``prefix`` in front of it on the wire; the default ``"/"``
    is what torch's client adds, so both share keys. Connecting retries until
    ``timeout`` so that a store that is still starting is waited for. Each
    call is bounded by ``timeout`` too; ``wait`` and ``barrier`` take their
    own. Calls release the GIL and can be interrupted with Ctrl-C.

    Raises :class:`~relaunch.StoreConnectionError` when the store cannot be
    reached or the connection breaks (the next call reconnects),
    :class:`~relaunch.StoreTimeoutError` when a call runs out of time, and
    :class:`~relaunch.StoreRequestError` for a key or value beyond the
    store's limits (8 KiB keys, 8 MiB values, as PyTorch).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float | timedelta = DEFAULT_TIMEOUT,
        prefix: str = "/",
    ):
        if not isinstance(host, str) or not host:
            raise TypeError(f"host must be a non-empty str, not {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        self._host = host
        self._port = port
        self._native = _native.Store(host, port, _seconds(timeout), prefix)

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self._native.timeout)

    def __repr__(self) -> str:
        return f"Store({self._host!r}, {self._port}, timeout={self._native.timeout}s)"

    def set(self, key: str, value: Value) -> None:
        """Sets ``key`` to ``value``, waking everyone waiting for ``key``."""
        self._native.set(_key(key), _bytes(value))

    def get(self, key: str) -> bytes:
        """Waits up to the store's timeout for ``key``, then returns its value."""
        return self._native.get(_key(key))

    def add(self, key: str, amount: int) -> int:
        """Adds ``amount`` to the integer at ``key`` (missing counts as 0); returns the sum."""
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"amount must be an int, not {type(amount).__name__}")
        return self._native.add(_key(key), amount)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Sets ``key`` to ``desired`` if it holds ``expected``; returns the value now.

        As in PyTorch: on a missing key, an empty ``expected`` creates it with
        ``desired``, and any other ``expected`` is returned unchanged.
        """
        return self._native.compare_set(
            _key(key), _bytes(expected, "expected"), _bytes(desired, "desired")
        )

    def wait(self, keys: str | Sequence[str], timeout: float | timedelta | None = None) -> None:
        """Waits until every key exists (default timeout: the store's)."""
        seconds = None if timeout is None else _seconds(timeout)
        self._native.wait(_keys(keys), seconds)

    def check(self, keys: str | Sequence[str]) -> bool:
        """Whether every key exists, without waiting."""
        return self._native.check(_keys(keys))

    def delete_key(self, key: str) -> bool:
        """Deletes ``key``; returns whether it existed."""
        return self._native.delete_key(_key(key))

    def num_keys(self) -> int:
        """Number of keys on the server (all clients' keys, queues not counted)."""
        return self._native.num_keys()

    def append(self, key: str, value: Value) -> None:
        """Appends ``value`` to the value at ``key`` (creating it)."""
        self._native.append(_key(key), _bytes(value))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """Waits for every key, then returns their values in order."""
        return self._native.multi_get(_keys(keys))

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Sets each key to the value at the same position."""
        keys, values = _keys(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        self._native.multi_set([(k, _bytes(v)) for k, v in zip(keys, values, strict=True)])

    def barrier(self, key: str, world_size: int, timeout: float | timedelta | None = None) -> None:
        """Arrives at barrier ``key`` and waits until ``world_size`` callers have.

        The key counts arrivals, so use a fresh key for each barrier.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        seconds = None if timeout is None else _seconds(timeout)
        self._native.barrier(_key(key), world_size, seconds)

    def queue_push(self, key: str, value: Value) -> None:
        """Appends ``value`` to queue ``key``, waking one blocked ``queue_pop``."""
        self._native.queue_push(_key(key), _bytes(value))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Removes and returns the oldest item of queue ``key``.

        With ``block``, waits up to the store's timeout for an item; without,
        raises :class:`~relaunch.QueueEmptyError` when there is none.
        """
        return self._native.queue_pop(_key(key), bool(block))

    def queue_len(self, key: str) -> int:
        """Number of items in queue ``key``."""
        return self._native.queue_len(_key(key))

    def list_keys(self) -> list[str]:
        """Every key on the server, in no particular order."""
        return self._native.list_keys()

    def ping(self) -> None:
        """One round trip; raises if the store does not answer in time."""
        self._native.ping()
