"""Child processes for the examples, tests and benchmarks: ``relaunch store
serve`` and ``relaunch server`` as children, and what ``/proc`` says of a process tree."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

_LISTENING = re.compile(r"^listening on (\S+):(\d+)$")
_T = TypeVar("_T", bound="_ServerChild")
# "(data in DIR)", "(database postgres DB, files in s3://BUCKET/PREFIX)", ...
_SERVING = re.compile(r"^relaunch server: (http://\S+):(\d+) \(.*\)$")


class _ServerChild:
    """A ``relaunch`` server child process that announces its port on stderr,
    stopped with SIGTERM on exit. Its stderr is collected in :attr:`log`
    (and echoed when ``echo`` is set)."""

    _ready: re.Pattern[str]
    _what: str

    def __init__(
        self,
        args: Sequence[str],
        *,
        echo: bool,
        startup_timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log: list[str] = []
        self._echo = echo
        self._started = threading.Event()
        self.port = 0
        self._address = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "relaunch", *args],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + startup_timeout
        while not self._started.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self._what} did not start:\n" + "".join(self.log))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if self._echo:
                sys.stderr.write(line)
            match = self._ready.match(line.strip())
            if match and not self._started.is_set():
                self._address, self.port = match.group(1), int(match.group(2))
                self._started.set()

    def stop(self, timeout: float = 30.0) -> int:
        """Sends SIGTERM, waits for the exit and returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout)
        return code

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to tidy up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(30)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StoreProcess(_ServerChild):
    """A ``relaunch store serve`` child process."""

    _ready = _LISTENING
    _what = "relaunch store serve"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_args: Sequence[str] = (),
        *,
        echo: bool = False,
        startup_timeout: float = 30.0,
    ):
        self.host = host
        args = ["store", "serve", "--host", host, "--port", str(port), *extra_args]
        super().__init__(args, echo=echo, startup_timeout=startup_timeout)


class ServerProcess(_ServerChild):
    """A ``relaunch server`` child process on loopback; :attr:`url` once ready.

    ``port=0`` picks a free port; pass the same ``port`` and ``data_dir`` to
    start it again where it was.
    """

    _ready = _SERVING
    _what = "relaunch server"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int = 0,
        extra_args: Sequence[str] = (),
        *,
        echo: bool = False,
        startup_timeout: float = 30.0,
        env: dict[str, str] | None = None,
    ):
        self.data_dir = Path(data_dir)
        args = ["server", "--data-dir", os.fspath(data_dir), "--host", "127.0.0.1"]
        args += ["--port", str(port), *extra_args]
        super().__init__(args, echo=echo, startup_timeout=startup_timeout, env=env)

    @property
    def url(self) -> str:
        return f"{self._address}:{self.port}"


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry.name))
    return out
