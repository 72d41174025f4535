"""Fixtures: our store and PyTorch's own store, and the tracking server, each in a
child process on loopback."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import netns
import pytest

from relaunch._subprocess import ServerProcess, StoreProcess

# PyTorch's own server (libuv backend), bound to a loopback socket we hand it,
# serving until its stdin closes.
TORCH_SERVER = r"""
import socket, sys
import torch.distributed as dist
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(("127.0.0.1", 0))
sock.listen(4096)
store = dist.TCPStore("127.0.0.1", sock.getsockname()[1], is_master=True,
                      wait_for_workers=False, master_listen_fd=sock.fileno(), use_libuv=True)
print(store.port, flush=True)
sys.stdin.read()
"""


class TorchServer:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", TORCH_SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("torch's TCPStore server did not start")
        self.host, self.port = "127.0.0.1", int(line)

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(autouse=True)
def _state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own XDG state directory: the client's default spool
    directory (``$XDG_STATE_HOME/relaunch/runs``) is the test's, inherited by
    the processes it starts, never the machine user's."""
    state = tmp_path / "xdg-state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture
def hosts(request: pytest.FixtureRequest) -> Iterator[netns.Hosts]:
    """Three hosts on one machine (``@pytest.mark.hosts(N)`` for N), each a
    network namespace with its own address (see ``netns.py``); everything
    is deleted and every process in them killed at teardown. Skips where
    namespaces cannot be made, and fails instead under CI (``CI`` set)."""
    marker = request.node.get_closest_marker("hosts")
    count = marker.args[0] if marker else 3
    try:
        made = netns.Hosts(count)
    except netns.Unavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e} (CI is set, so this fails instead of skipping)")
        pytest.skip(str(e))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store_server() -> Iterator[StoreProcess]:
    """``relaunch store serve`` on 127.0.0.1 and a free port."""
    server = StoreProcess()
    yield server
    assert server.stop() == 0, "".join(server.log)


@pytest.fixture
def torch_server() -> Iterator[TorchServer]:
    server = TorchServer()
    yield server
    server.stop()


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def relaunch_run() -> Iterator[Callable[..., subprocess.Popen]]:
    """``relaunch_run(*args, env=None, cwd=None)``: starts ``relaunch run
    ARGS`` (``env`` added to this environment), its stdout and stderr piped
    as text; kills whatever is left running at the end (its workers die
    with it: parent-death signal)."""
    started: list[subprocess.Popen] = []

    def start(
        *args: object, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaunch", "run", *map(str, args)],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


class TrackingServer:
    """``relaunch server`` on 127.0.0.1 that a test can stop, kill -9 and
    start again on the same port and data directory.

    :attr:`log` is the current process's stderr; :meth:`close` (the
    fixtures' teardown) kills it whatever state the test left it in.
    """

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env
        self.port = 0
        self.child: ServerProcess | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> list[str]:
        return self.child.log if self.child is not None else []

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Starts the server (on its old port after a stop or kill) and waits until it serves."""
        assert not self.running, "the server is already running"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.child = ServerProcess(
                    self.data_dir,
                    self.port,
                    self.args,
                    env=self.env,
                    startup_timeout=max(1.0, deadline - time.monotonic()),
                )
            except RuntimeError as e:
                # The old port may linger for a moment after a kill -9.
                if "in use" in str(e) and time.monotonic() < deadline:
                    continue
                raise
            self.port = self.child.port
            return

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, as a service manager stops it; returns the exit code."""
        assert self.child is not None
        return self.child.stop(timeout)

    def kill(self) -> None:
        """SIGKILL: no chance to finish anything."""
        assert self.child is not None
        self.child.kill()

    def restart(self) -> None:
        if self.running:
            self.stop()
        self.start()

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()


# RELAUNCH_TEST_SERVERS=replicas: every tracking server of the tests is two
# replicas on PostgreSQL + S3 (scripts/test.sh runs the tracking tests once
# more this way).
REPLICAS = os.environ.get("RELAUNCH_TEST_SERVERS") == "replicas"
# Read now: some test modules clear RELAUNCH_* from the environment.
_POSTGRES = os.environ.get("RELAUNCH_TEST_POSTGRES")
_S3 = os.environ.get("RELAUNCH_TEST_S3")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REPLICAS:
        return
    skip = pytest.mark.skip(reason="looks at the server's data directory on disk")
    for item in items:
        if "local_storage" in item.keywords:
            item.add_marker(skip)


def _psql(url: str, sql: str) -> None:
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql], check=True)


class ReplicatedServer:
    """Two ``relaunch server`` replicas on a database of their own (on the
    PostgreSQL that scripts/test.sh starts, ``RELAUNCH_TEST_POSTGRES``) with
    their chunks under a prefix of their own in its S3 bucket
    (``RELAUNCH_TEST_S3``), behind :class:`TrackingServer`'s interface:
    clients write through the first (:attr:`url`), tests read through the
    second (:attr:`read_url`), so every read proves a write is visible on
    another replica; stop, kill and start act on both."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        admin, bucket = _POSTGRES, _S3
        if not admin or not bucket:
            raise RuntimeError(
                "RELAUNCH_TEST_SERVERS=replicas needs RELAUNCH_TEST_POSTGRES and RELAUNCH_TEST_S3 "
                "(scripts/test.sh starts both)"
            )
        self.admin = admin
        self.database = f"replicas_{secrets.token_hex(6)}"
        _psql(admin, f"CREATE DATABASE {self.database}")
        parts = urllib.parse.urlsplit(admin)
        url = urllib.parse.urlunsplit(parts._replace(path=f"/{self.database}"))
        self.backend = ["--database", url, "--blobs", f"{bucket}/{self.database}"]
        self.data_dir = data_dir
        self.replicas = [
            TrackingServer(data_dir / name, *self.backend, *args, env=env) for name in ("a", "b")
        ]

    @property
    def url(self) -> str:
        return self.replicas[0].url

    @property
    def read_url(self) -> str:
        return self.replicas[1].url

    @property
    def port(self) -> int:
        return self.replicas[0].port

    @property
    def read_port(self) -> int:
        return self.replicas[1].port

    @property
    def log(self) -> list[str]:
        return self.replicas[0].log

    @property
    def running(self) -> bool:
        return all(r.running for r in self.replicas)

    @property
    def args(self) -> list[str]:
        return self.replicas[0].args[len(self.backend) :]

    @args.setter
    def args(self, args: list[str]) -> None:
        for r in self.replicas:
            r.args = [*self.backend, *args]

    def start(self, timeout: float = 30.0) -> None:
        for r in self.replicas:
            r.start(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        codes = [r.stop(timeout) for r in self.replicas]
        return next((c for c in codes if c != 0), 0)

    def kill(self) -> None:
        for r in self.replicas:
            r.kill()

    def restart(self) -> None:
        for r in self.replicas:
            r.restart()

    def close(self) -> None:
        for r in self.replicas:
            r.close()
        _psql(self.admin, f"DROP DATABASE IF EXISTS {self.database} WITH (FORCE)")


@pytest.fixture
def tracking_servers(tmp_path: Path) -> Iterator[Callable[..., TrackingServer]]:
    """Starts ``relaunch server`` children: ``tracking_servers(*flags, env=None)``,
    each with a data directory of its own; all are killed at teardown. Under
    ``RELAUNCH_TEST_SERVERS=replicas`` each is a :class:`ReplicatedServer`."""
    servers: list[TrackingServer] = []
    kind = ReplicatedServer if REPLICAS else TrackingServer

    def start(*args: str, env: dict[str, str] | None = None) -> TrackingServer:
        server = kind(tmp_path / f"server-data-{len(servers)}", *args, env=env)
        servers.append(server)  # type: ignore[arg-type]
        return server  # type: ignore[return-value]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def tracking_server(tracking_servers: Callable[..., TrackingServer]) -> TrackingServer:
    """A ``relaunch server`` on 127.0.0.1 with ``--durability process``."""
    return tracking_servers("--durability", "process")
