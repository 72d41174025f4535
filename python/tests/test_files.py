"""A run's files end to end: the real ``relaunch server``, the Python API
and the CLI, an uploader killed mid-file, a real HTTP proxy (proxy.py, as on
cluster login nodes), chunks damaged on the way and on disk."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for
from forward_proxy import ForwardProxy

import relaunch

RELAUNCH = [sys.executable, "-m", "relaunch"]
MiB = 1 << 20


def random_file(path: Path, size: int, seed: int) -> Path:
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def new_run(server: TrackingServer, run: str) -> None:
    status, body = request(
        server,
        "POST",
        "/api/v1/runs",
        json.dumps({"id": run, "attempt_token": "t"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200, body


def request(
    server: TrackingServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*RELAUNCH, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def stored_chunks(server: TrackingServer) -> int:
    """Chunks on the server: stored (chunks/ab/HASH) or received for a file
    not yet committed (chunks/staged/ab/HASH; .-names are being written)."""
    root = server.data_dir / "chunks"
    found = [*root.glob("??/*"), *root.glob("staged/??/*")]
    return sum(1 for p in found if p.is_file() and not p.name.startswith("."))


def test_a_file_round_trips_and_a_changed_one_sends_only_what_changed(tracking_server, tmp_path):
    server = tracking_server
    new_run(server, "r")
    original = random_file(tmp_path / "model.pt", 24 * MiB, seed=1)
    first = relaunch.upload_file(original, "r", "ckpt/model.pt", server=server.url)
    assert (first.size, first.sent_bytes) == (24 * MiB, 24 * MiB)
    assert first.chunks == first.sent_chunks >= 6

    # 10% of the weights change in place: most chunks are already there.
    data = bytearray(original.read_bytes())
    data[8 * MiB : 8 * MiB + int(2.4 * MiB)] = random.Random(2).randbytes(int(2.4 * MiB))
    changed = tmp_path / "model2.pt"
    changed.write_bytes(bytes(data))
    second = relaunch.upload_file(changed, "r", "ckpt/model2.pt", server=server.url)
    assert second.sent_bytes <= 0.2 * second.size, second
    again = relaunch.upload_file(changed, "r", "ckpt/model2.pt", server=server.url)
    assert (again.sent_chunks, again.sent_bytes) == (0, 0)

    got = relaunch.download("r", "ckpt/model2.pt", tmp_path / "out", server=server.url)
    assert got.path.read_bytes() == bytes(data)
    assert got.blake3 == second.blake3 and got.resumed_from == 0

    status, body = request(server, "GET", "/api/v1/openapi.json")
    assert status == 200
    paths = json.loads(body)["paths"]
    assert {
        "/chunks/missing",
        "/chunks/{hash}",
        "/runs/{id}/files",
        "/runs/{id}/files/{name}",
    } <= set(paths)

    out = cli("files", "ls", "r", "--server", server.url, "--format", "json")
    assert out.returncode == 0, out.stderr
    listed = {f["name"]: f["size"] for f in json.loads(out.stdout)}
    assert listed == {"ckpt/model.pt": 24 * MiB, "ckpt/model2.pt": 24 * MiB}


UPLOADER = """
import sys, relaunch
relaunch.upload_file(sys.argv[1], "r", "big.bin", server=sys.argv[2])
"""


@pytest.mark.local_storage
def test_an_uploader_killed_mid_file_resumes_and_sends_only_what_is_missing(
    tracking_server, tmp_path
):
    server = tracking_server
    new_run(server, "r")
    big = random_file(tmp_path / "big.bin", 96 * MiB, seed=3)
    proc = subprocess.Popen([sys.executable, "-c", UPLOADER, big, server.url])
    try:
        wait_for(lambda: stored_chunks(server) >= 8 or proc.poll() is not None, 120, "chunks")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    # What the server stored of it, once requests in flight at the kill ended
    # (the count holds still for two seconds: a chunk's fsync on a loaded disk).
    before, deadline = -1, time.monotonic() + 60
    while (now := stored_chunks(server)) != before and time.monotonic() < deadline:
        before = now
        time.sleep(2)
    status, _ = request(server, "GET", "/api/v1/runs/r/files/big.bin")
    assert status == 404  # nothing visible before the commit

    done = relaunch.upload_file(big, "r", "big.bin", server=server.url)
    assert done.chunks - done.sent_chunks == before, (done, before)
    assert done.sent_bytes < done.size
    got = relaunch.download("r", "big.bin", tmp_path / "back.bin", server=server.url)
    assert got.path.read_bytes() == big.read_bytes()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[str]:
    """proxy.py on 127.0.0.1; yields its URL. Its access log is proxy.log."""
    port_file = tmp_path / "proxy.port"
    log = (tmp_path / "proxy.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0",
         "--port-file", port_file, "--num-workers", "1", "--num-acceptors", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "proxy.py")
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_transfers_go_through_an_http_proxy(tracking_server, proxy, tmp_path):
    server = tracking_server
    new_run(server, "r")
    path = random_file(tmp_path / "weights.bin", 6 * MiB, seed=4)
    via = {"http_proxy": proxy, "HTTP_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""}
    out = cli("files", "put", "r", path, "--server", server.url, env=via)
    assert out.returncode == 0, out.stderr
    out = cli(
        "files", "get", "r", "weights.bin", tmp_path / "got.bin", "--server", server.url, env=via
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "got.bin").read_bytes() == path.read_bytes()
    log = (tmp_path / "proxy.log").read_text()
    assert "PUT 127.0.0.1" in log and "/api/v1/chunks/" in log, log[-2000:]
    assert "GET 127.0.0.1" in log and "/files/weights.bin" in log

    # A proxy that is down is named in the error, with the way around it.
    dead = {**via, "http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    out = cli("files", "ls", "r", "--server", server.url, env=dead)
    assert out.returncode == 1
    assert "through the proxy http://127.0.0.1:9" in out.stderr and "NO_PROXY" in out.stderr

    # NO_PROXY as IP ranges: reqwest goes around the proxy, and so does the
    # message about a server that is down (it used to blame the proxy).
    ranges = "10.0.0.0/8,127.0.0.0/8"
    around = {**dead, "no_proxy": ranges, "NO_PROXY": ranges}
    out = cli("files", "ls", "r", "--server", server.url, env=around)
    assert out.returncode == 0, out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = cli("files", "ls", "r", "--server", down, env=around)
    assert out.returncode == 1 and "cannot reach" in out.stderr, out.stderr
    assert "proxy" not in out.stderr, out.stderr


def test_a_server_short_of_memory_answers_503_and_the_upload_waits_for_it(
    tracking_servers, tmp_path
):
    """Chunks arrive faster than a server with 4 MiB for request bodies
    can hold them: it answers 503 with Retry-After, the client waits as
    asked and sends again, and the file arrives whole (seen through a
    proxy that counts the answers)."""
    four = str(4 * MiB)
    server = tracking_servers("--max-request-bytes", four, "--max-body-memory", four)
    new_run(server, "r")
    proxy = ForwardProxy()
    try:
        via = {
            **os.environ,
            "http_proxy": proxy.url,
            "HTTP_PROXY": proxy.url,
            "no_proxy": "",
            "NO_PROXY": "",
            "RELAUNCH_DIRECT_UPLOADS": "off",  # every byte through the server
        }
        path = random_file(tmp_path / "w.bin", 24 * MiB, seed=21)
        out = cli("files", "put", "r", path, "--server", server.url, env=via)
        assert out.returncode == 0, out.stderr
        assert proxy.statuses("PUT", 503) >= 1, proxy.answers
    finally:
        proxy.shutdown()
    got = relaunch.download("r", "w.bin", tmp_path / "back.bin", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()


@pytest.mark.local_storage
def test_damage_is_refused_on_the_way_in_and_caught_on_the_way_out(tracking_server, tmp_path):
    server = tracking_server
    new_run(server, "r")
    path = random_file(tmp_path / "data.bin", 3 * MiB, seed=5)
    relaunch.upload_file(path, "r", "data.bin", server=server.url)

    # A chunk whose bytes are not those its hash names is refused (the
    # stdlib has no BLAKE3: the name of a stored chunk serves).
    chunk = next((server.data_dir / "chunks").glob("??/*"))
    status, body = request(server, "PUT", f"/api/v1/chunks/{chunk.name}", bytes(1000))
    assert status == 400 and b"damaged on the way" in body, body

    # A chunk damaged on the server's disk never reaches a file as wrong bytes.
    raw = bytearray(chunk.read_bytes())
    raw[100] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    dest = tmp_path / "out.bin"
    out = cli("files", "get", "r", "data.bin", dest, "--server", server.url)
    assert out.returncode == 1
    assert not dest.exists()
    # The server's stderr is read by a thread: wait for the line, not the scheduler.
    wait_for(
        lambda: "damaged on disk" in "".join(server.log), 30, "the server's damaged-on-disk line"
    )
    # Uploading the file again repairs the chunk (its name says what it must hold).
    chunk.unlink()
    relaunch.upload_file(path, "r", "data.bin", server=server.url)
    out = cli("files", "get", "r", "data.bin", dest, "--server", server.url)
    assert out.returncode == 0, out.stderr
    assert dest.read_bytes() == path.read_bytes()


def test_a_download_resumes_from_its_partial_file(tracking_server, tmp_path):
    server = tracking_server
    new_run(server, "r")
    path = random_file(tmp_path / "data.bin", 5 * MiB, seed=6)
    relaunch.upload_file(path, "r", "data.bin", server=server.url)
    dest = tmp_path / "copy.bin"
    partial = tmp_path / "copy.bin.relaunch-part"
    partial.write_bytes(path.read_bytes()[: 2 * MiB])
    got = relaunch.download("r", "data.bin", dest, server=server.url)
    assert got.resumed_from == 2 * MiB
    assert dest.read_bytes() == path.read_bytes() and not partial.exists()

    # A partial file that is not a prefix of the file is caught by the hash.
    partial.write_bytes(bytes(MiB))
    with pytest.raises(relaunch.TrackingError, match="download again"):
        relaunch.download("r", "data.bin", dest, server=server.url)
    assert not partial.exists()
    assert dest.read_bytes() == path.read_bytes()  # the old file is intact
    assert relaunch.download("r", "data.bin", dest, server=server.url).resumed_from == 0


def test_a_plain_streaming_put_and_range_reads_work_for_curl_users(tracking_server, tmp_path):
    server = tracking_server
    new_run(server, "r")
    data = random.Random(7).randbytes(3 * MiB + 17)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        # Chunked transfer encoding, as `curl -T -` sends a pipe.
        conn.putrequest("PUT", "/api/v1/runs/r/files/plain/data.bin")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        for i in range(0, len(data), 100_000):
            piece = data[i : i + 100_000]
            conn.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.send(b"0\r\n\r\n")
        response = conn.getresponse()
        info = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 201, info
    assert info["size"] == len(data)

    status, body = request(
        server, "GET", "/api/v1/runs/r/files/plain/data.bin", headers={"Range": "bytes=1000-1999"}
    )
    assert status == 206 and body == data[1000:2000]
    status, body = request(
        server, "GET", "/api/v1/runs/r/files/plain/data.bin", headers={"Range": "bytes=-17"}
    )
    assert status == 206 and body == data[-17:]
    # The same bytes uploaded by the client share every chunk.
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert relaunch.upload_file(path, "r", "copy.bin", server=server.url).sent_bytes == 0


def test_bad_names_and_runs_get_clear_errors(tracking_server, tmp_path):
    server = tracking_server
    new_run(server, "r")
    path = random_file(tmp_path / "x.bin", 1000, seed=8)
    for name in ["../x", "/etc/passwd", "a//b", "a/./b", ""]:
        with pytest.raises(relaunch.TrackingConfigError, match="file name"):
            relaunch.upload_file(path, "r", name, server=server.url)
    with pytest.raises(relaunch.TrackingRejectedError, match='no run "nope"'):
        relaunch.upload_file(path, "nope", "x.bin", server=server.url)
    with pytest.raises(FileNotFoundError):
        relaunch.upload_file(tmp_path / "missing.bin", "r", server=server.url)
    with pytest.raises(relaunch.TrackingRejectedError, match="no file"):
        relaunch.download("r", "absent.bin", tmp_path / "a", server=server.url)
    out = cli("files", "get", "r", "../../etc/passwd", "--server", server.url)
    assert out.returncode == 1 and "file name" in out.stderr
    for path_ in ("/api/v1/runs/r/files/..%2f..%2fetc%2fpasswd", "/api/v1/runs/r/files/%2e%2e/x"):
        status, body = request(server, "GET", path_)
        assert 400 <= status < 500 and json.loads(body)["error"], (path_, status)


def test_save_file_snapshots_at_once_and_uploads_in_the_background(tracking_server, tmp_path):
    server = tracking_server
    run = relaunch.init("files", id="saver", server=server.url, dir=tmp_path / "spool")
    path = random_file(tmp_path / "model.pt", 5 * MiB, seed=9)
    original = path.read_bytes()
    assert run.save_file(path, "ckpt/model.pt") == "ckpt/model.pt"
    # Written again (by rename, as torch.save-then-move does) right away:
    # what was saved is what save_file saw.
    random_file(tmp_path / "next.pt", 5 * MiB, seed=10).rename(path)
    run.save({"step": 7, "w": [1.0, 2.0]}, "state/last.pt")
    run.finish(timeout=60)
    got = relaunch.download("saver", "ckpt/model.pt", tmp_path / "back.pt", server=server.url)
    assert got.path.read_bytes() == original
    state = relaunch.download("saver", "state/last.pt", tmp_path / "last.pt", server=server.url)
    import torch

    assert torch.load(state.path) == {"step": 7, "w": [1.0, 2.0]}
    assert not list((tmp_path / "spool").rglob("data"))  # nothing left waiting
    # Issue 34: the spool kept an empty `.uploads` folder for good.
    assert not list((tmp_path / "spool").rglob(".uploads")), sorted((tmp_path / "spool").rglob("*"))


SAVER = """
import os, sys, relaunch
server, spool, path, mode = sys.argv[1:]
run = relaunch.init("files", id="crashy", server=server, dir=spool, offline=mode == "offline")
run.save_file(path, "weights.bin")
os.kill(os.getpid(), 9)   # before any upload could finish
"""


def test_a_saved_file_outlives_its_process_and_is_uploaded_by_the_next(tracking_servers, tmp_path):
    server = tracking_servers("--durability", "process")
    spool = tmp_path / "spool"
    path = random_file(tmp_path / "w.bin", 2 * MiB, seed=11)
    assert server.stop() == 0  # down while the trainer saves
    proc = subprocess.run([sys.executable, "-c", SAVER, server.url, spool, path, "online"])
    assert proc.returncode == -signal.SIGKILL
    assert list(spool.rglob(".uploads/*/data"))
    server.start()
    run = relaunch.init("files", id="crashy", server=server.url, dir=spool)
    run.finish(timeout=60)  # the dead process's upload went with this one's
    got = relaunch.download("crashy", "weights.bin", tmp_path / "a.bin", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()

    # Offline, `relaunch sync` uploads it.
    proc = subprocess.run([sys.executable, "-c", SAVER, server.url, spool, path, "offline"])
    assert proc.returncode == -signal.SIGKILL
    out = cli("sync", spool, "--server", server.url)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "uploaded weights.bin (2097152 bytes)" in out.stdout, out.stdout
    assert not list(spool.rglob(".uploads/*/data"))
    assert not list(spool.rglob(".uploads")), sorted(spool.rglob("*"))
