"""Several "hosts" on one machine, for multi-node tests: one network
namespace per host, each with its own address on a bridge of its own, and a
link that a test can cut and restore.

::

    bridge namespace  relaunch-PID-N-br:  br0 ── h0 ─┐ ── h1 ─┐ ...
                                                     │veth    │veth
    host namespaces   relaunch-PID-N-h0:  eth0 10.77.0.1/24   │
                      relaunch-PID-N-h1:             eth0 10.77.0.2/24

Nothing of it lives in the root namespace, so a test binds only to these
addresses (or a namespace's own loopback) and nothing outside can reach it,
nor the machine's firewall get in its way. Names carry the pid and a
counter, so parallel runs never collide; namespaces left by a run that died
(its pid gone) are deleted by the next.

A test asks for the ``hosts`` fixture (``python/tests/conftest.py``; three
hosts, or ``@pytest.mark.hosts(4)``)::

    h = hosts[1]
    proc = h.popen(["relaunch", "run", ...], env=env, stdout=f)   # a subprocess.Popen
    h.cut()        # the host's link is down: its packets go nowhere, nothing is reset
    h.restore()    # and up again
    h.pids()       # every process inside the host (to SIGSTOP a hung node, say)

Teardown (:meth:`Hosts.close`, also on a failed test) SIGKILLs every process
inside every namespace, whoever started it, then deletes the namespaces
(their links go with them).

Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and
iproute2's ``ip``; :class:`Unavailable` says which is missing.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

SUBNET = "10.77.0"
# The interface inside each host; GLOO_SOCKET_IFNAME names it.
IFACE = "eth0"
_PREFIX = "relaunch-"
_counter = itertools.count()


class Unavailable(RuntimeError):
    """Network namespaces cannot be made here; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _ns_pids(ns: str) -> list[int]:
    out = _ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_all_in(ns: str, timeout: float = 10.0) -> None:
    """SIGKILLs every process inside ``ns`` and waits until none is left."""
    deadline = time.monotonic() + timeout
    while pids := _ns_pids(ns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {ns} survive SIGKILL")
        time.sleep(0.05)


def _delete(ns: str) -> None:
    _kill_all_in(ns)
    _ip("netns", "delete", ns, check=False)


def sweep_leftovers() -> None:
    """Deletes the namespaces of earlier runs whose process is gone."""
    for ns in _namespaces():
        m = re.fullmatch(rf"{_PREFIX}(\d+)-\d+-(?:br|h\d+)", ns)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _delete(ns)


def check_available() -> None:
    """Raises :class:`Unavailable` unless this process can make namespaces."""
    if shutil.which("ip") is None:
        raise Unavailable("needs iproute2's `ip` to create network namespaces")
    if os.geteuid() != 0:
        raise Unavailable("needs root to create network namespaces")


class Host:
    """One host: a network namespace with address :attr:`addr` on ``eth0``."""

    def __init__(self, hosts: Hosts, index: int) -> None:
        self._hosts = hosts
        self.index = index
        self.name = f"h{index}"
        self.ns = f"{hosts.prefix}-h{index}"
        self.addr = f"{SUBNET}.{index + 1}"
        # The bridge's end of the host's cable, in the bridge namespace.
        self._port = f"h{index}"

    def __repr__(self) -> str:
        return f"Host({self.name}, {self.addr})"

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` as a command that runs inside this host."""
        return ["ip", "netns", "exec", self.ns, *map(str, args)]

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Starts ``args`` inside this host (``subprocess.Popen``'s keywords);
        teardown kills it, and anything it started, if it still runs."""
        # `ip netns exec` execs the command: the Popen's pid is the command's.
        proc = subprocess.Popen(self.command(args), **kwargs)
        self._hosts._started.append(proc)
        return proc

    def run(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` inside this host."""
        return subprocess.run(self.command(args), **kwargs)

    def pids(self) -> list[int]:
        """Every process running inside this host."""
        return _ns_pids(self.ns)

    def cut(self) -> None:
        """Unplugs the host: the bridge's port for it goes down, so what it
        sends is lost and nothing reaches it; no connection is reset."""
        _ip("-n", self._hosts.bridge_ns, "link", "set", self._port, "down")

    def restore(self) -> None:
        """Plugs the host back in."""
        _ip("-n", self._hosts.bridge_ns, "link", "set", self._port, "up")


class Hosts(Sequence[Host]):
    """``count`` hosts on one bridge; :meth:`close` deletes everything."""

    def __init__(self, count: int) -> None:
        check_available()
        self.prefix = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
        self.bridge_ns = f"{self.prefix}-br"
        self._started: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._hosts = [Host(self, i) for i in range(count)]
        try:
            sweep_leftovers()
            self._build()
        except Exception as e:
            self.close()
            if isinstance(e, Unavailable):
                raise
            raise Unavailable(f"cannot create network namespaces: {e}") from e

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _build(self) -> None:
        br = self.bridge_ns
        self._add_ns(br)
        _ip("-n", br, "link", "add", "br0", "type", "bridge")
        _ip("-n", br, "link", "set", "br0", "up")
        for h in self._hosts:
            self._add_ns(h.ns)
            _ip("-n", br, "link", "add", h._port, "type", "veth", "peer", "name", IFACE,
                "netns", h.ns)  # fmt: skip
            _ip("-n", br, "link", "set", h._port, "master", "br0", "up")
            _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", IFACE)
            _ip("-n", h.ns, "link", "set", IFACE, "up")

    def __getitem__(self, i):  # type: ignore[override]
        return self._hosts[i]

    def __len__(self) -> int:
        return len(self._hosts)

    def __iter__(self) -> Iterator[Host]:
        return iter(self._hosts)

    def close(self) -> None:
        """Kills every process in every host, reaps those started here, and
        deletes the namespaces. Safe to call twice."""
        errors = []
        for ns in reversed(self._made):
            try:
                _delete(ns)
            except RuntimeError as e:
                errors.append(str(e))
        self._made.clear()
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                errors.append(f"pid {proc.pid} did not exit after SIGKILL")
        if errors:
            raise RuntimeError("; ".join(errors))
