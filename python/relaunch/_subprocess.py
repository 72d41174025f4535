"""Child processes for the examples, tests and benchmarks: ``relaunch store
serve`` as a child, and what ``/proc`` says of a process tree."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

_LISTENING = re.compile(r"^listening on (\S+):(\d+)$")


class StoreProcess:
    """A ``relaunch store serve`` child process, stopped with SIGTERM on exit.

    Its stderr is collected in :attr:`log` (and echoed when ``echo`` is set).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_args: Sequence[str] = (),
        *,
        echo: bool = False,
        startup_timeout: float = 30.0,
    ):
        self.log: list[str] = []
        self._echo = echo
        self._listening = threading.Event()
        self.host = host
        self.port = 0
        args = [sys.executable, "-m", "relaunch", "store", "serve"]
        args += ["--host", host, "--port", str(port), *extra_args]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + startup_timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    "relaunch store serve did not start listening:\n" + "".join(self.log)
                )

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if self._echo:
                sys.stderr.write(line)
            match = _LISTENING.match(line.strip())
            if match and not self._listening.is_set():
                self.port = int(match.group(2))
                self._listening.set()

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

    def __enter__(self) -> StoreProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
