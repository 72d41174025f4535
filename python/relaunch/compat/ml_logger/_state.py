"""What the shim keeps on this machine beside relaunch's client, under the
client's directory (``RELAUNCH_DIR``, else ``$XDG_STATE_HOME/relaunch/runs``,
else ``~/.local/state/relaunch/runs``, as relaunch's client picks it):

``.ml-logger/pickles``
    The BLAKE3 of every pickle this machine's loggers wrote (``save_pkl``,
    ``log_data``, ``memoize``'s cache), one a line: ``load_pkl`` unpickles
    without consent only bytes whose hash is listed here (see
    :func:`trusted`). Kept to the newest ``MAX_PICKLES``.
``.ml-logger/outbox/``
    Params that could not reach the server (``_outbox``).

A directory starting with a dot is never taken for a run's spool by
relaunch's client or ``relaunch sync``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

from relaunch import _native

MAX_PICKLES = 100_000
"""Hashes kept in the record of pickles written here (the oldest go first)."""


def client_dir() -> str:
    """relaunch's client directory, as ``relaunch.init`` picks it."""
    named = os.environ.get("RELAUNCH_DIR", "").strip()
    if named:
        return os.path.abspath(named)
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        home = os.environ.get("HOME", "")
        state = os.path.join(home, ".local", "state") if os.path.isabs(home) else ""
    if not state:
        return os.path.abspath("relaunch-runs")
    return os.path.join(state, "relaunch", "runs")


def state_dir() -> str:
    path = os.path.join(client_dir(), ".ml-logger")
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """An exclusive lock on ``path`` (created), held by this process until the block ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pickles() -> str:
    return os.path.join(state_dir(), "pickles")


def remember(data: bytes) -> str:
    """Records ``data`` (a pickle this process wrote) as trusted; returns its BLAKE3."""
    digest = _native.hash_bytes(bytes(data))
    path = _pickles()
    with locked(path + ".lock"):
        with open(path, "a", encoding="ascii") as f:
            f.write(digest + "\n")
        if os.path.getsize(path) > 65 * MAX_PICKLES * 2:
            with open(path, encoding="ascii") as f:
                kept = f.read().split()[-MAX_PICKLES:]
            with open(path + ".tmp", "w", encoding="ascii") as f:
                f.write("".join(d + "\n" for d in kept))
            os.replace(path + ".tmp", path)
    return digest


def trusted(data: bytes) -> bool:
    """Whether ``data`` is, byte for byte, a pickle that a logger of this
    machine wrote (with this client directory): its BLAKE3, computed here on
    the bytes about to be unpickled, is in the record. Neither the server
    nor anyone who can write to it can add to that record."""
    path = _pickles()
    if not os.path.exists(path):
        return False
    digest = _native.hash_bytes(bytes(data))
    with open(path, encoding="ascii") as f:
        return any(line.strip() == digest for line in f)
