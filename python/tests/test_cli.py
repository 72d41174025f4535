"""The `relaunch` command as a user runs it: help, version, bad flags, and
`relaunch store serve` starting, refusing bad input and stopping cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from relaunch import Store
from relaunch._subprocess import StoreProcess

RELAUNCH = [sys.executable, "-m", "relaunch"]


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*RELAUNCH, *args], capture_output=True, text=True, timeout=timeout)


def test_help_names_the_commands():
    out = run("--help")
    assert out.returncode == 0
    assert "Keep distributed PyTorch jobs alive" in out.stdout
    assert "store" in out.stdout
    serve = run("store", "serve", "--help")
    assert serve.returncode == 0
    for flag in ["--host", "--port", "--max-value-bytes", "--max-frame-bytes"]:
        assert flag in serve.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["store", "serve", "--port", "70000"], "70000"),
        (["store", "serve", "--port", "abc"], "invalid value 'abc'"),
        (["store", "serve", "--max-value-bytes", "lots"], "is not a size"),
        (["store", "serve", "--bogus"], "unexpected argument '--bogus'"),
        (["nonsense"], "unrecognized subcommand 'nonsense'"),
    ],
)
def test_bad_flags_exit_2_before_anything_starts(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "listening" not in out.stderr


def test_contradictory_limits_are_refused():
    out = run("store", "serve", "--port", "0", "--max-frame-bytes", "1KiB")
    assert out.returncode == 1
    assert "raise --max-frame-bytes" in out.stderr


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = run("store", "serve", "--host", "127.0.0.1", "--port", str(port))
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "in use" in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_signals(sig):
    server = StoreProcess()
    client = Store("127.0.0.1", server.port, timeout=5)
    client.set("k", "v")
    assert client.get("k") == b"v"  # SET has no reply: make sure it was applied
    server.proc.send_signal(sig)
    assert server.stop() == 0  # waits for the exit and for the whole log
    log = "".join(server.log)
    assert "store shutting down" in log
    assert "connections=1" in log and "keys=1" in log


def test_port_zero_prints_the_chosen_port():
    with StoreProcess(port=0) as server:
        assert server.port > 0
        assert f"listening on 127.0.0.1:{server.port}\n" in server.log
        Store("127.0.0.1", server.port, timeout=5).ping()


def test_a_malformed_client_is_logged_and_others_carry_on(store_server):
    good = Store("127.0.0.1", store_server.port, timeout=5)
    good.set("k", "v")
    with socket.create_connection(("127.0.0.1", store_server.port)) as bad:
        bad.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert bad.recv(1) == b""  # closed by the server
    assert good.get("k") == b"v"
    # The log arrives through a pipe read by another thread: wait for it.
    deadline = time.monotonic() + 10
    while "closing connection" not in "".join(store_server.log):
        assert time.monotonic() < deadline, "".join(store_server.log)
        time.sleep(0.02)
    assert "not a TCPStore client" in "".join(store_server.log)


def doctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RELAUNCH, "doctor", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_doctor_checks_the_host_and_finds_torch():
    out = doctor()
    assert out.returncode == 0, out.stdout
    for check in ["locked memory", "/dev/shm", "open files", "hostname", "rendezvous port"]:
        assert check in out.stdout
    assert re.search(r"ok +python +.*: torch 2\.\d+", out.stdout), out.stdout


def test_doctor_fails_on_a_missing_interface_and_says_what_to_do():
    env = dict(os.environ, NCCL_SOCKET_IFNAME="=nosuch0")
    out = doctor("--format", "json", env=env)
    assert out.returncode == 1
    findings = {f["check"]: f for f in json.loads(out.stdout)}
    net = findings["network interfaces"]
    assert net["level"] == "fail"
    assert "names =nosuch0 but this host has" in net["found"]
    assert "set NCCL_SOCKET_IFNAME to one of the interfaces" in net["fix"]


def test_doctor_fails_on_a_taken_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = doctor("--port", str(busy.getsockname()[1]))
    assert out.returncode == 1
    assert "FAIL  rendezvous port" in out.stdout


def test_run_warns_about_host_problems_before_starting(tmp_path):
    env = dict(os.environ, https_proxy="http://proxy.invalid:3128")
    env.pop("no_proxy", None)
    env.pop("NO_PROXY", None)
    out = subprocess.run(
        [*RELAUNCH, "run", "--no-python", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0
    assert "relaunch: warning: proxies: https_proxy=http://proxy.invalid:3128" in out.stderr
    assert "(see `relaunch doctor`)" in out.stderr
