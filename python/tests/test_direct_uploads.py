"""Chunks straight to S3: a server with ``--blobs`` hands clients presigned
PUT URLs, each bound to its chunk's SHA-256 (which the bucket checks), and
confirms each chunk (size and SHA-256, as the bucket says) at the commit.
Run against the SeaweedFS that scripts/test.sh starts, with the real
client (``relaunch files put``, ``relaunch.upload_file``) and, for the
faults, plain HTTP: a body the bucket refuses, a URL that expired on the
way (through a proxy that holds it), a server restarted between the PUT
and the commit, and a client that never commits."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for
from forward_proxy import ForwardProxy
from test_files import cli, new_run, random_file, request

import relaunch
from relaunch import _native

S3 = os.environ.get("RELAUNCH_TEST_S3")
pytestmark = pytest.mark.skipif(
    not S3, reason="needs RELAUNCH_TEST_S3 (scripts/test.sh starts SeaweedFS)"
)
MiB = 1024 * 1024


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[Callable[..., TrackingServer]]:
    """``s3_server(*flags)``: a ``relaunch server`` with its chunks under a
    prefix of its own in the test bucket; killed at teardown."""
    prefix = f"{S3}/direct-{secrets.token_hex(4)}"
    servers: list[TrackingServer] = []

    def start(*flags: str) -> TrackingServer:
        data = tmp_path / f"server-{len(servers)}"
        server = TrackingServer(data, "--durability", "process", "--blobs", prefix, *flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def api(server: TrackingServer, method: str, path: str, body: object) -> tuple[int, dict]:
    status, raw = request(
        server, method, path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    return status, json.loads(raw) if raw else {}


def chunk(data: bytes) -> dict:
    return {
        "hash": relaunch_blake3(data),
        "size": len(data),
        "sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
    }


def relaunch_blake3(data: bytes) -> str:
    return _native.hash_bytes(data)


def put(url: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, ""
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def manifest(name: str, parts: list[bytes]) -> dict:
    whole = b"".join(parts)
    return {
        "name": name,
        "size": len(whole),
        "blake3": relaunch_blake3(whole),
        "chunks": [{"hash": relaunch_blake3(p), "size": len(p)} for p in parts],
    }


def urls_for(server: TrackingServer, parts: list[bytes]) -> list[dict]:
    status, answer = api(
        server, "POST", "/api/v1/chunks/uploads", {"chunks": [chunk(p) for p in parts]}
    )
    assert status == 200, answer
    return answer["uploads"]


def put_before_expiry(server: TrackingServer, part: bytes) -> None:
    """PUT one chunk with URLs that live 1 s: on a loaded machine the PUT can
    come after that, so a 403 asks for a new URL, as the client does."""
    for _ in range(20):
        (upload,) = urls_for(server, [part])
        status, text = put(upload["url"], upload["headers"], part)
        if status != 403:
            assert status == 200, text
            return
    raise AssertionError("20 URLs in a row expired before their PUT reached the bucket")


def test_a_file_goes_straight_to_the_bucket_and_reads_back_whole(s3_server, tmp_path):
    server = s3_server()
    new_run(server, "r")
    path = random_file(tmp_path / "model.pt", 24 * MiB, seed=7)
    on = {**os.environ, "RELAUNCH_DIRECT_UPLOADS": "on"}
    # "on": straight to the bucket or fail, never through the server.
    out = cli("files", "put", "r", path, "--server", server.url, env=on)
    assert out.returncode == 0, out.stderr
    got = relaunch.download("r", "model.pt", tmp_path / "back.pt", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()
    # Confirmed at the commit, so they serve dedup: the same bytes under
    # another name send nothing.
    again = relaunch.upload_file(path, "r", "renamed.pt", server=server.url)
    assert again.sent_chunks == 0 and again.chunks > 10, again
    # The answer that tells clients, and the status line that tells users.
    status, answer = api(server, "POST", "/api/v1/chunks/missing", {"chunks": []})
    assert status == 200 and answer["direct"] is True, answer
    assert any("clients send chunks straight to it" in line for line in server.log), server.log


def test_through_the_server_when_asked_or_when_the_server_says_so(
    s3_server, tracking_server, tmp_path
):
    path = random_file(tmp_path / "w.bin", 6 * MiB, seed=8)
    # --no-direct-uploads: the server takes every chunk itself, and a client
    # that insists on the bucket is told why it cannot.
    server = s3_server("--no-direct-uploads")
    new_run(server, "r")
    status, answer = api(server, "POST", "/api/v1/chunks/missing", {"chunks": []})
    assert answer["direct"] is False, answer
    status, answer = api(server, "POST", "/api/v1/chunks/uploads", {"chunks": []})
    assert status == 409 and "PUT /api/v1/chunks/HASH" in answer["error"], answer
    on = {**os.environ, "RELAUNCH_DIRECT_UPLOADS": "on"}
    out = cli("files", "put", "r", path, "--server", server.url, env=on)
    assert out.returncode != 0 and "--no-direct-uploads" in out.stderr, out.stderr
    off = {**os.environ, "RELAUNCH_DIRECT_UPLOADS": "off"}
    assert cli("files", "put", "r", path, "--server", server.url, env=off).returncode == 0
    bad = {**os.environ, "RELAUNCH_DIRECT_UPLOADS": "sometimes"}
    out = cli("files", "put", "r", path, "--server", server.url, env=bad)
    assert out.returncode != 0 and "RELAUNCH_DIRECT_UPLOADS" in out.stderr, out.stderr
    # Bad upload queries are refused, saying what is wrong.
    direct = s3_server()
    data = os.urandom(1000)
    for wrong, says in [
        ({**chunk(data), "sha256": "not base64"}, "not a SHA-256 in base64"),
        ({**chunk(data), "size": 0}, "chunks are 1 to"),
        ({**chunk(data), "hash": "xyz"}, "hash"),
    ]:
        status, answer = api(direct, "POST", "/api/v1/chunks/uploads", {"chunks": [wrong]})
        assert status == 400 and says in answer["error"], answer


def test_a_body_the_bucket_refuses_is_never_committed_and_a_retry_succeeds(s3_server, tmp_path):
    server = s3_server()
    new_run(server, "r")
    parts = [os.urandom(300_000), os.urandom(200_000)]
    uploads = urls_for(server, parts)
    assert [u["hash"] for u in uploads] == [relaunch_blake3(p) for p in parts]
    # Other bytes than the URL's checksum (a damaged transfer, or a lying
    # client): the bucket itself refuses them.
    status, said = put(uploads[0]["url"], uploads[0]["headers"], os.urandom(300_000))
    assert status == 400 and "BadDigest" in said, (status, said)
    # Without the checksum header the signature does not hold.
    status, _ = put(uploads[1]["url"], {}, parts[1])
    assert status == 403
    status, _ = put(uploads[1]["url"], uploads[1]["headers"], parts[1])
    assert status == 200
    status, answer = api(server, "POST", "/api/v1/runs/r/files", manifest("f.bin", parts))
    assert status == 409 and "not in the bucket" in answer["error"], answer
    status, _ = request(server, "GET", "/api/v1/runs/r/files/f.bin")
    assert status == 404  # not committed, not even in part
    # The real client sends what is missing and commits.
    path = tmp_path / "f.bin"
    path.write_bytes(b"".join(parts))
    done = relaunch.upload_file(path, "r", "f.bin", server=server.url)
    assert done.size == path.stat().st_size
    got = relaunch.download("r", "f.bin", tmp_path / "back.bin", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()


def test_a_server_restarted_between_the_puts_and_the_commit_commits_whole(s3_server, tmp_path):
    server = s3_server()
    new_run(server, "r")
    parts = [os.urandom(400_000), os.urandom(100_000)]
    for upload, part in zip(urls_for(server, parts), parts, strict=True):
        assert put(upload["url"], upload["headers"], part)[0] == 200
    # Handed out, stored, but not confirmed: no one's dedup uses them yet.
    status, answer = api(
        server, "POST", "/api/v1/chunks/missing", {"chunks": [relaunch_blake3(p) for p in parts]}
    )
    assert len(answer["missing"]) == 2, answer
    server.stop()
    server.start()
    status, answer = api(server, "POST", "/api/v1/runs/r/files", manifest("f.bin", parts))
    assert status == 201, answer
    status, body = request(server, "GET", "/api/v1/runs/r/files/f.bin")
    assert status == 200 and body == b"".join(parts)
    status, answer = api(
        server, "POST", "/api/v1/chunks/missing", {"chunks": [relaunch_blake3(p) for p in parts]}
    )
    assert answer["missing"] == [], answer


def test_chunks_never_committed_are_collected_and_the_upload_still_succeeds(s3_server, tmp_path):
    server = s3_server("--upload-url-expiry", "1", "--unconfirmed-grace", "2")
    new_run(server, "r")
    parts = [os.urandom(250_000), os.urandom(250_000)]
    for part in parts:
        put_before_expiry(server, part)
    # The client is killed here: it never commits. After the grace period
    # the server deletes the objects and forgets them.
    wait_for(lambda: any("never committed" in line for line in server.log), 60, "the collection")
    status, answer = api(server, "POST", "/api/v1/runs/r/files", manifest("f.bin", parts))
    assert status == 409, answer  # the objects are gone: nothing half-there is committed
    path = tmp_path / "f.bin"
    path.write_bytes(b"".join(parts))
    relaunch.upload_file(path, "r", "f.bin", server=server.url)
    status, body = request(server, "GET", "/api/v1/runs/r/files/f.bin")
    assert status == 200 and body == path.read_bytes()
    # A grace period no longer than a URL's life is refused at start.
    out = cli(
        "server",
        "--blobs",
        f"{S3}/x",
        "--upload-url-expiry",
        "60",
        "--unconfirmed-grace",
        "60",
        "--port",
        "0",
    )
    assert out.returncode != 0 and "--unconfirmed-grace" in out.stderr, out.stderr


def test_a_url_that_expired_on_the_way_is_asked_for_again(s3_server, tmp_path):
    server = s3_server("--upload-url-expiry", "1", "--unconfirmed-grace", "60")
    new_run(server, "r")
    bucket_port = urllib.parse.urlsplit(os.environ["AWS_ENDPOINT_URL"]).port
    proxy = ForwardProxy(hold_port=bucket_port, hold=2.0)
    try:
        via = f"http://127.0.0.1:{proxy.server_address[1]}"
        env = {
            **os.environ,
            "RELAUNCH_DIRECT_UPLOADS": "on",  # no way around the bucket
            "http_proxy": via,
            "HTTP_PROXY": via,
            "no_proxy": "",
            "NO_PROXY": "",
        }
        path = random_file(tmp_path / "w.bin", 3 * MiB, seed=11)
        out = cli("files", "put", "r", path, "--server", server.url, env=env)
        assert out.returncode == 0, out.stderr
        assert proxy.statuses("PUT", 403) >= 1  # the bucket did refuse the late PUTs
    finally:
        proxy.shutdown()
    got = relaunch.download("r", "w.bin", tmp_path / "back.bin", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()


def test_a_client_that_cannot_reach_the_bucket_sends_through_the_server(s3_server, tmp_path):
    """The server is reachable (``localhost``, outside the proxy), the
    bucket only through a proxy that is down: the client falls back to the
    server for every chunk, says so once, and the file arrives whole."""
    server = s3_server()
    new_run(server, "r")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        **os.environ,
        "http_proxy": dead,
        "HTTP_PROXY": dead,
        "no_proxy": "localhost",
        "NO_PROXY": "localhost",
    }
    env.pop("RELAUNCH_DIRECT_UPLOADS", None)
    path = random_file(tmp_path / "w.bin", 6 * MiB, seed=12)
    via_name = f"http://localhost:{server.port}"
    out = cli("files", "put", "r", path, "--server", via_name, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("through the server from now on") == 1, out.stderr
    got = relaunch.download("r", "w.bin", tmp_path / "back.bin", server=server.url)
    assert got.path.read_bytes() == path.read_bytes()
    # "on" refuses to go around the bucket.
    on = {**env, "RELAUNCH_DIRECT_UPLOADS": "on"}
    other = random_file(tmp_path / "x.bin", 2 * MiB, seed=13)
    out = cli("files", "put", "r", other, "--server", via_name, env=on)
    assert out.returncode != 0 and "not stored after" in out.stderr, out.stderr
