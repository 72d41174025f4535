"""Fixtures: our store and PyTorch's own store, each in a child process on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from relaunch._subprocess import StoreProcess

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
