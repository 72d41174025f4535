"""Local mode: a local directory as the root is a relaunch data directory,
served by a ``relaunch server --data-dir ROOT`` on 127.0.0.1 that this
machine's processes share. Nothing needs starting by hand, and afterwards
``relaunch server --data-dir ROOT`` (or the dashboard it serves) shows the
same runs.

The first process that needs the root starts the server (the ``relaunch``
binary installed with this package, found as ``python -m relaunch`` finds
it) on a free port of 127.0.0.1, in a session of its own (a Ctrl-C to the
script reaches the script, which then ships what it logged), and writes
``ROOT/.ml-logger/server.json``: its URL, its pid and the processes using
it. Like ``relaunch server`` on loopback it takes no token, so the
dashboard link works as printed (and other users of this machine can reach
it, as they could read ml-logger's local files). Another process with the
same root finds that file under a lock, checks that the server is alive and
answers, and joins it instead of starting a second server on the same
SQLite database. Each process leaves at its exit (``release_all``, after
its runs are shipped); the last one to leave stops the server. The server's own output
goes to ``ROOT/.ml-logger/server.log``.

A process that dies without its exit hooks (SIGKILL, an unhandled SIGTERM,
``os._exit``) cannot leave: the server then stays up until the next process
that uses the root leaves it (dead users are dropped as the list is read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

from relaunch.errors import TrackingConfigError, TrackingConnectionError

STATE_DIR = ".ml-logger"
"""The folder of ROOT that holds the server's state, lock and log."""

_ANNOUNCED = re.compile(r"^relaunch server: (http://\S+) \(")


@dataclasses.dataclass
class _Held:
    root: str
    url: str
    pid: int
    started: str | None  # the server's start time (/proc), against pid reuse
    holder: int  # the process that joined (a forked child has not)
    proc: subprocess.Popen | None  # when this process started the server


_held: dict[str, _Held] = {}

before_leaving: list[Callable[[], None]] = []
"""Called (in order) at exit before this process leaves its local servers:
whatever still has to reach a server registers here, as the text files and
relaunch's runs are shipped first (see ``_logger._at_exit_local``)."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (``/proc/PID/stat``), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is the same live process (not a zombie, not a reused pid)."""
    now = _start_time(pid)
    return now is not None and (started is None or now == started)


def _me() -> list:
    return [os.getpid(), _start_time(os.getpid())]


@contextlib.contextmanager
def _locked(state_dir: str) -> Iterator[None]:
    try:
        fd = os.open(os.path.join(state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise TrackingConfigError(
            f"cannot open {state_dir}/lock ({e.strerror}); give a local root you can write to"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_state(state_dir: str) -> dict | None:
    try:
        with open(os.path.join(state_dir, "server.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(state, dict) and isinstance(state.get("pid"), int)
    return state if ok and isinstance(state.get("url"), str) else None


def _write_state(state_dir: str, state: dict) -> None:
    path = os.path.join(state_dir, "server.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def _answers(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _binary() -> str:
    from relaunch._cli import _binary as find

    try:
        return str(find())
    except SystemExit as e:  # _cli says it as the command line would
        raise TrackingConfigError(
            f"local mode needs the relaunch server, which is not installed: {e}"
        ) from None


def _users(state: dict) -> list[list]:
    users = state.get("users")
    if not isinstance(users, list):
        return []
    return [u for u in users if isinstance(u, list) and len(u) == 2 and isinstance(u[0], int)]


def server_for(root: str, timeout: float) -> str:
    """The URL of the server on the data directory ``root``: the one
    this process holds, one that another process started and that answers
    (joined), or a new one."""
    held = _held.get(root)
    if held is not None and held.holder == os.getpid():
        return held.url
    state_dir = os.path.join(root, STATE_DIR)
    try:
        os.makedirs(state_dir, exist_ok=True)
    except OSError as e:
        raise TrackingConfigError(
            f"local root {root}: cannot create {state_dir} ({e.strerror}); give a root "
            "you can write to"
        ) from None
    with _locked(state_dir):
        state = _read_state(state_dir)
        if state is not None and _alive(state["pid"], state.get("started")):
            if not _answers(state["url"], min(timeout, 10.0)):
                raise TrackingConnectionError(
                    f"the local server of {root} (pid {state['pid']}, {state['url']}) runs "
                    f"but does not answer; see {state_dir}/server.log, stop it (kill "
                    f"{state['pid']}) and try again"
                )
            state["users"] = [u for u in _users(state) if u != _me() and _alive(u[0], u[1])] + [
                _me()
            ]
            _write_state(state_dir, state)
            held = _Held(
                root,
                state["url"],
                state["pid"],
                state.get("started"),
                os.getpid(),
                None,
            )
        else:
            held = _start(root, state_dir, timeout)
            _write_state(
                state_dir,
                {
                    "root": root,
                    "url": held.url,
                    "pid": held.pid,
                    "started": held.started,
                    "users": [_me()],
                },
            )
    _held[root] = held
    return held.url


def _start(root: str, state_dir: str, timeout: float) -> _Held:
    env = {
        k: v for k, v in os.environ.items() if k not in ("RELAUNCH_SERVER_TOKEN", "RELAUNCH_LOG")
    }
    log_path = os.path.join(state_dir, "server.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                _binary(),
                "server",
                "--data-dir",
                root,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--log",
                "warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )
    deadline = time.monotonic() + max(timeout, 10.0)
    while True:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                announced = _ANNOUNCED.match(line.strip())
                if announced:
                    return _Held(
                        root,
                        announced[1],
                        proc.pid,
                        _start_time(proc.pid),
                        os.getpid(),
                        proc,
                    )
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc.pid, proc)
            with open(log_path, encoding="utf-8", errors="replace") as f:
                said = f.read().strip()[-2000:]
            raise TrackingConfigError(
                f"the local server of {root} did not start (`relaunch server --data-dir "
                f"{root}`): {said or 'it said nothing'}"
            )
        time.sleep(0.02)


def _stop(pid: int, proc: subprocess.Popen | None, started: str | None = None) -> None:
    """SIGTERM (the server finishes what it has), SIGKILL after 30 s."""
    if proc is not None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return
    if not _alive(pid, started):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _alive(pid, started):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.02)


def held() -> list[str]:
    """The roots whose server this process has joined."""
    return [root for root, h in _held.items() if h.holder == os.getpid()]


def release(root: str) -> None:
    """Leaves the server of ``root``; the last process to leave stops it.
    Call it once nothing of this process goes to that server any more."""
    held = _held.pop(root, None)
    if held is None or held.holder != os.getpid():
        return
    state_dir = os.path.join(root, STATE_DIR)
    with _locked(state_dir):
        state = _read_state(state_dir)
        if state is not None and state["pid"] == held.pid:
            users = [u for u in _users(state) if u != _me() and _alive(u[0], u[1])]
            if users:
                state["users"] = users
                _write_state(state_dir, state)
                return  # others still log to it; the last of them stops it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(state_dir, "server.json"))
        _stop(held.pid, held.proc, held.started)


def release_all() -> None:
    """Leaves every local server this process joined (at exit, and in tests)."""
    for root in held():
        release(root)
