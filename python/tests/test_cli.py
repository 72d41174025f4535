"""The `relaunch` command as a user runs it: help, version, bad flags, and
`relaunch store serve` starting, refusing bad input and stopping cleanly."""

from __future__ import annotations

import http.server
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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


def slow_checkpoint(ckpt: Path, seconds: float) -> float:
    """Commits one real checkpoint whose save takes `seconds`; its recorded time."""
    code = (
        "import sys, time, relaunch\n"
        "ckpt = relaunch.Checkpointer(sys.argv[1])\n"
        "with ckpt.save(7, force=True) as d:\n"
        "    (d / 'w.bin').write_bytes(b'x' * 1000)\n"
        "    time.sleep(float(sys.argv[2]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAUNCH_", "MASTER_"))}
    subprocess.run([sys.executable, "-c", code, str(ckpt), str(seconds)], check=True, env=env,
                   timeout=60)  # fmt: skip
    manifest = json.loads((ckpt / "step_00000007" / "manifest.json").read_text())
    assert manifest["save_seconds"] >= seconds, manifest
    return manifest["save_seconds"]


def test_doctor_compares_the_grace_period_with_the_last_checkpoint(tmp_path):
    """A grace period (no runtime shows it: --grace-period or
    RELAUNCH_GRACE_PERIOD) shorter than the last save fails, one less than
    twice it warns, a long one is fine; each says by how much."""
    took = slow_checkpoint(tmp_path / "ckpt", 1.5)
    # Relative to what the save took (its fsyncs are slower on a loaded disk).
    short, close, long = (f"{g:.2f}" for g in (took / 2, took * 1.5, max(60, 3 * took)))
    levels = {}
    for grace in (short, close, long):
        out = doctor("--format", "json", "--ckpt-dir", str(tmp_path / "ckpt"),
                     "--grace-period", grace)  # fmt: skip
        (finding,) = [f for f in json.loads(out.stdout) if f["check"] == "grace period"]
        assert f"step 7) took {took:.1f} s" in finding["found"], finding
        assert f"kills {float(grace):.0f} s after" in finding["found"], finding
        levels[grace] = (finding["level"], out.returncode)
    assert levels == {short: ("fail", 1), close: ("warn", 0), long: ("ok", 0)}, levels
    env = dict(os.environ, RELAUNCH_GRACE_PERIOD="1")
    out = doctor("--format", "json", "--ckpt-dir", str(tmp_path / "ckpt"), env=env)
    (finding,) = [f for f in json.loads(out.stdout) if f["check"] == "grace period"]
    assert finding["level"] == "fail", finding
    assert f"terminationGracePeriodSeconds: {math.ceil(2 * took)} " in finding["fix"], finding


def test_doctor_says_what_is_wrong_with_its_stop_inputs(tmp_path):
    out = doctor("--grace-period", "soon")
    assert out.returncode == 2
    assert '"soon" is not a number of seconds' in out.stderr, out.stderr
    out = doctor("--format", "json", "--ckpt-dir", str(tmp_path / "nothing-here"))
    (finding,) = [f for f in json.loads(out.stdout) if f["check"] == "last checkpoint"]
    assert finding["level"] == "warn" and "nothing-here" in finding["found"], finding
    (tmp_path / "empty").mkdir()
    out = doctor("--format", "json", "--ckpt-dir", str(tmp_path / "empty"))
    (finding,) = [f for f in json.loads(out.stdout) if f["check"] == "last checkpoint"]
    assert finding["found"].startswith("no committed checkpoint in"), finding


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


class _Redirect(http.server.BaseHTTPRequestHandler):
    """Answers every request with a 307 to ``server.target`` + the path."""

    def do_GET(self) -> None:
        self.send_response(307)
        self.send_header("Location", self.server.target + self.path)  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirector() -> Iterator[Callable[[str], str]]:
    """``redirector(target)``: the URL of a plain-HTTP server redirecting there."""
    servers = []

    def start(target: str) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
        server.target = target  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_plain_http_server_redirecting_to_https_is_refused_with_the_address_to_use(
    tracking_server, redirector
):
    """Over plain HTTP the client loads no certificates; a redirect to an
    https:// address (a load balancer forcing TLS) is refused, naming it and
    the flag to give it to, while a redirect to another http:// address is
    followed."""
    out = run("runs", "ls", "--server", redirector("https://tracking.invalid"))
    assert out.returncode == 1
    assert "redirected to https://tracking.invalid/api/v1/runs" in out.stderr, out.stderr
    assert "give its https:// address (--server or RELAUNCH_SERVER)" in out.stderr, out.stderr
    out = run("runs", "ls", "--server", redirector(tracking_server.url), "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []
