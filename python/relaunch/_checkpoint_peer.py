"""The memory tier of a job over several nodes: each node's part of a
snapshot, its replica on the next node, and the whole snapshot put
together again after a restart.

A snapshot (``Checkpointer(memory_every=N)``) of a job on ``n`` nodes is
``n`` parts: node ``i`` commits the files its ranks wrote as
``NODE_TIER/part_i/step_S`` (a checkpoint directory whose manifest names its
part, the number of parts and the save's ``id``), in the directory that its
launcher holds in shared memory. Its node leader (``LOCAL_RANK`` 0) then
sends the part, in the background, to node ``(i + 1) % n``, which keeps it
under the same name: a replica. Each node keeps the two newest parts of
each kind, so a commit or a replication cut short leaves the snapshot
before it whole.

Every node leader serves its node's tier (:class:`TierServer`: HTTP, on
the address the node reaches the job's store from, with a secret that the
store hands out) for the replicas sent to it and for the parts others
fetch. After a restart, :meth:`relaunch.Checkpointer.latest` agrees
through the store on the newest snapshot whose parts, all of one save,
some live node holds; each node leader then puts it together as
``NODE_TIER/step_S`` (its own parts copied, the others fetched from the
nodes that hold them), so a node lost with its launcher loses nothing that
its peer holds.
"""

from __future__ import annotations

import contextlib
import hmac
import http.client
import http.server
import io
import json
import os
import queue
import re
import secrets
import shutil
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from relaunch import _native
from relaunch._checkpoint_files import (
    FORMAT,
    MANIFEST,
    STEP_DIR,
    canonical,
    read_manifest,
    remove,
    safe_name,
    verify_checkpoint,
    write_atomic,
)
from relaunch._checkpoint_tier import Tier, tree_size
from relaunch.errors import CheckpointError

# The header that carries the tier's secret (from the store) with each request.
HEADER = "X-Relaunch-Tier"
PART_DIR = re.compile(r"^part_(\d+)$")
# How many committed steps of each part a node keeps: the newest, and the one
# before in case the newest is not whole on every node.
KEEP = 2
# How long a connection may stay silent (no byte either way) before the
# other side gives up on it.
PEER_TIMEOUT = 20.0
_BLOCK = 1 << 20
_TOKEN = r"[0-9a-f]+-[0-9a-f]+"
_FILE = re.compile(rf"^/part_(\d+)/(step_\d+)(\.tmp-{_TOKEN})?/(.+)$")
_COMMIT = re.compile(rf"^/part_(\d+)/step_(\d+)\.tmp-({_TOKEN})$")


def part_root(node_tier: Path, part: int) -> Path:
    return node_tier / f"part_{part}"


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def committed_parts(node_tier: Path) -> list[dict[str, Any]]:
    """Every part this node holds whole (by its manifest and file sizes):
    ``{"part", "parts", "step", "id"}`` each."""
    out = []
    try:
        parts = list(os.scandir(node_tier))
    except FileNotFoundError:
        return []
    for entry in parts:
        if not PART_DIR.match(entry.name):
            continue
        try:
            steps = list(os.scandir(entry.path))
        except FileNotFoundError:
            continue
        for step_entry in steps:
            match = STEP_DIR.match(step_entry.name)
            if not match:
                continue
            manifest, _ = verify_checkpoint(Path(step_entry.path), int(match.group(1)), False)
            if manifest is None or not isinstance(manifest.get("part"), int):
                continue
            out.append(
                {
                    "part": manifest["part"],
                    "parts": manifest.get("parts"),
                    "step": manifest["step"],
                    "id": manifest.get("id"),
                }
            )
    return out


def newest_whole(holdings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest save of which every part is held somewhere: ``{"step",
    "id", "parts"}``, or None."""
    saves: dict[tuple[int, str], tuple[int, set[int]]] = {}
    for held in holdings:
        key = (held["step"], held["id"])
        parts, have = saves.setdefault(key, (held["parts"], set()))
        if held["parts"] == parts:
            have.add(held["part"])
    for (step, save_id), (parts, have) in sorted(saves.items(), reverse=True):
        if isinstance(parts, int) and parts > 0 and have == set(range(parts)):
            return {"step": step, "id": save_id, "parts": parts}
    return None


def prune_part(root: Path, keep: int = KEEP) -> None:
    """Deletes all but the ``keep`` newest committed steps of one part."""
    steps = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        match = STEP_DIR.match(entry.name)
        if match:
            steps.append((int(match.group(1)), Path(entry.path)))
    for _, path in sorted(steps)[:-keep]:
        aside = path.with_name(f"{path.name}.old-{os.urandom(4).hex()}-0")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue
        remove(aside)


def remove_temporaries(root: Path) -> None:
    """Removes replicas that were never committed in one part's directory
    (their senders died or were cut off): called once a replica of that
    part is committed, when no other is on its way (one sender per part)."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if ".tmp-" in entry.name or ".old-" in entry.name:
            remove(Path(entry.path))


def local_address() -> str:
    """This node's address as the other nodes see it: the one it reaches
    the job's store from (``RELAUNCH_STORE``, else ``MASTER_ADDR``)."""
    addr = os.environ.get("RELAUNCH_STORE", "").strip()
    host = addr.rpartition(":")[0].strip("[]") if addr else os.environ.get("MASTER_ADDR", "")
    host = host or "127.0.0.1"
    family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)  # UDP: no packet is sent, only a route chosen
        return probe.getsockname()[0]


# --- serving a node's tier ----------------------------------------------------------


class TierServer:
    """Serves a node's tier (``node_tier``: ``part_I/step_S`` directories)
    to the job's other nodes, from threads of this process:

    - ``GET /part_I/step_S/NAME``: a file of a committed part;
    - ``PUT /part_I/step_S.tmp-TOKEN/NAME`` (``Content-Length``): a file of a
      replica being received, refused (507) past the tier's ``budget``;
    - ``POST /part_I/step_S.tmp-TOKEN``: commits that replica once its
      manifest and files verify, replacing one of the same step, keeping the
      part's two newest steps.

    Each request carries the secret in :data:`HEADER` (403 without), and
    its line and headers arrive within ``header_timeout`` seconds, however
    they trickle in (else the connection is closed)."""

    def __init__(
        self,
        node_tier: Path,
        host: str,
        budget: int | None,
        launcher_dir: Path,
        header_timeout: float = PEER_TIMEOUT,
    ) -> None:
        self.node_tier = node_tier
        self.budget = budget
        self.launcher_dir = launcher_dir
        self.secret = secrets.token_hex(16)
        handler = type("Handler", (_Handler,), {"tier": self, "header_timeout": header_timeout})
        self._httpd = _PooledServer((host, 0), handler)
        self.address = _join(host, self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="relaunch-tier-server", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _PooledServer(http.server.HTTPServer):
    """An HTTP server whose connections are served by a few threads that
    live as long as it does: a stalled or half-open connection holds one of
    them, not the server, and no thread starts and ends per request, so
    none ends while the training code forks (DataLoader workers; before
    Python 3.11.10 a fork while a thread ends can deadlock the child,
    CPython gh-112275)."""

    WORKERS = 4

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        super().__init__(address, handler)
        # Connections waiting for a thread; past that many a new one is
        # closed at once (a flood holds no more sockets than this).
        self._connections: queue.Queue = queue.Queue(maxsize=16)
        for i in range(self.WORKERS):
            threading.Thread(target=self._work, name=f"relaunch-tier-{i}", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            self._connections.put_nowait((request, client_address))
        except queue.Full:
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            request, client_address = self._connections.get()
            if request is None:
                return
            try:
                self.finish_request(request, client_address)
            except Exception:
                pass  # that peer's connection only
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        for _ in range(self.WORKERS):
            with contextlib.suppress(Exception):
                self._connections.put((None, None), timeout=1)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Deadline(io.RawIOBase):
    """A socket's reads, each within the idle timeout and, while a deadline
    is set, before it: the idle timeout alone starts again at every byte, so
    a peer that trickles its headers would hold a thread for ever."""

    def __init__(self, sock: socket.socket, idle: float) -> None:
        self._sock, self._idle = sock, idle
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's line and headers took too long")
            self._sock.settimeout(min(left, self._idle))
        return self._sock.recv_into(buffer)

    def idle_timeout(self) -> None:
        """The socket's timeout back to the idle one (for the body and the
        answer), once the deadline is off."""
        self.deadline = None
        self._sock.settimeout(self._idle)


class _Handler(http.server.BaseHTTPRequestHandler):
    tier: TierServer
    protocol_version = "HTTP/1.1"
    timeout = PEER_TIMEOUT
    header_timeout = PEER_TIMEOUT

    def setup(self) -> None:
        super().setup()  # the socket's timeout: self.timeout
        self.rfile.close()
        self._reader = _Deadline(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # From the first byte of the request line (or of the wait for it on
        # a kept-alive connection) to the end of the headers.
        self._reader.deadline = time.monotonic() + self.header_timeout
        super().handle_one_request()

    def parse_request(self) -> bool:
        try:
            return super().parse_request()  # reads the headers
        finally:
            self._reader.idle_timeout()  # the body and the answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the job's stderr is for the job

    def _answer(self, status: int, text: str = "") -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _allowed(self) -> bool:
        given = self.headers.get(HEADER, "")
        if hmac.compare_digest(given.encode(), self.tier.secret.encode()):
            return True
        self.close_connection = True
        self._answer(403, f"this node's memory tier needs the job's secret in {HEADER}")
        return False

    def _path(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)

    def do_GET(self) -> None:
        if not self._allowed():
            return
        match = _FILE.match(self._path())
        if not match or match.group(3) or not safe_name(match.group(4)):
            self._answer(404, "want GET /part_I/step_S/NAME of a committed part")
            return
        path = part_root(self.tier.node_tier, int(match.group(1))) / match.group(2)
        try:
            file = open(path / match.group(4), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            self._answer(
                404, f"this node holds no {match.group(1)}/{match.group(2)}/{match.group(4)}"
            )
            return
        with file:
            size = os.fstat(file.fileno()).st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            self.wfile.flush()
            self.connection.sendfile(file)

    def do_PUT(self) -> None:
        if not self._allowed():
            return
        match = _FILE.match(self._path())
        length = self.headers.get("Content-Length", "")
        if not match or not match.group(3) or not safe_name(match.group(4)):
            self.close_connection = True
            self._answer(404, "want PUT /part_I/step_S.tmp-TOKEN/NAME")
            return
        if not length.isdigit():
            self.close_connection = True
            self._answer(411, "a replica's file needs a Content-Length")
            return
        size = int(length)
        tier = self.tier
        replica = part_root(tier.node_tier, int(match.group(1))) / (match.group(2) + match.group(3))
        target = replica / match.group(4)
        if tier.budget is not None:
            used = tree_size(tier.launcher_dir)
            if used + size > tier.budget:
                # The replica cannot be whole: what of it arrived goes, and
                # the body is read (not answered over) so that the sender
                # gets this answer rather than a reset.
                remove(replica)
                self._drain(size)
                self.close_connection = True
                self._answer(
                    507,
                    f"memory tier full: {used} of {tier.budget} bytes held, "
                    f"{size} more asked (--snapshot-memory)",
                )
                return
        target.parent.mkdir(parents=True, exist_ok=True)
        # Reserved at once (truncate: the size counts for the next check).
        with open(target, "wb") as out:
            out.truncate(size)
        left = size
        try:
            with open(target, "r+b") as out:
                while left:
                    block = self.rfile.read(min(left, _BLOCK))
                    if not block:
                        raise ConnectionError(f"the sender stopped {left} bytes short")
                    out.write(block)
                    left -= len(block)
        except (OSError, ConnectionError) as e:
            self.close_connection = True
            remove(replica)  # never whole now: its sender gives up on it
            with contextlib.suppress(Exception):
                self._answer(400, f"replica file not received whole: {e}")
            return
        self._answer(201)

    def _drain(self, size: int) -> None:
        with contextlib.suppress(Exception):
            while size > 0:
                block = self.rfile.read(min(size, _BLOCK))
                if not block:
                    return
                size -= len(block)

    def do_POST(self) -> None:
        if not self._allowed():
            return
        match = _COMMIT.match(self._path())
        if not match:
            self._answer(404, "want POST /part_I/step_S.tmp-TOKEN")
            return
        part, step = int(match.group(1)), int(match.group(2))
        root = part_root(self.tier.node_tier, part)
        tmp = root / f"{step_name(step)}.tmp-{match.group(3)}"
        manifest, problem = verify_checkpoint(tmp, step, full=False)
        if manifest is None or manifest.get("part") != part:
            remove(tmp)
            self._answer(409, f"replica of part {part}, step {step} is not whole: {problem}")
            return
        final = root / step_name(step)
        if final.exists():
            aside = root / f"{final.name}.old-{os.urandom(4).hex()}-0"
            os.rename(final, aside)
            remove(aside)
        os.rename(tmp, final)
        prune_part(root)
        remove_temporaries(root)
        self._answer(204)


# --- the client side: sending a replica, fetching a part -----------------------------


def _connect(address: str) -> http.client.HTTPConnection:
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(
        host.strip("[]"), int(port), timeout=PEER_TIMEOUT, blocksize=_BLOCK
    )


def _check(response: http.client.HTTPResponse, what: str) -> bytes:
    body = response.read()
    if response.status >= 300:
        text = body.decode(errors="replace").strip()
        raise CheckpointError(f"{what}: HTTP {response.status}: {text}")
    return body


def send_part(address: str, secret: str, part_dir: Path, part: int, step: int) -> None:
    """Sends committed part ``part_dir`` to the tier at ``address``, which
    commits it when every file arrived."""
    manifest, problem = verify_checkpoint(part_dir, step, full=False)
    if manifest is None:
        raise FileNotFoundError(f"{part_dir}: {problem}")
    token = f"{os.urandom(4).hex()}-{os.urandom(4).hex()}"
    base = f"/part_{part}/{step_name(step)}.tmp-{token}"
    conn = _connect(address)
    try:
        for name in [*sorted(manifest["files"]), MANIFEST]:
            with open(part_dir / name, "rb") as body:
                size = os.fstat(body.fileno()).st_size
                try:
                    conn.request(
                        "PUT",
                        f"{base}/{urllib.parse.quote(name)}",
                        body=body,
                        headers={HEADER: secret, "Content-Length": str(size)},
                    )
                except (BrokenPipeError, ConnectionResetError):
                    pass  # refused before the body was all sent: its answer says why
                _check(conn.getresponse(), f"sending {name}")
        conn.request("POST", base, headers={HEADER: secret, "Content-Length": "0"})
        _check(conn.getresponse(), "committing the replica")
    finally:
        conn.close()


def fetch_manifest(address: str, secret: str, part: int, step: int) -> dict[str, Any]:
    """The manifest of committed part ``part`` of ``step`` at ``address``."""
    conn = _connect(address)
    try:
        conn.request("GET", f"/part_{part}/{step_name(step)}/{MANIFEST}", headers={HEADER: secret})
        raw = _check(conn.getresponse(), f"fetching the manifest of part {part}")
    finally:
        conn.close()
    try:
        manifest = json.loads(raw)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("blake3") != _native.hash_bytes(
        canonical(manifest)
    ):
        raise CheckpointError(f"part {part} of step {step}: its manifest does not verify")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(safe_name(n) for n in files):
        raise CheckpointError(f"part {part} of step {step} names a file outside it")
    return manifest


def fetch_files(
    address: str, secret: str, part: int, step: int, manifest: dict[str, Any], into: Path
) -> None:
    """Fetches the files ``manifest`` names of part ``part`` of ``step``
    from ``address`` into directory ``into``, each checked for its size."""
    base = f"/part_{part}/{step_name(step)}"
    conn = _connect(address)
    try:
        for name, entry in sorted(manifest["files"].items()):
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            conn.request("GET", f"{base}/{urllib.parse.quote(name)}", headers={HEADER: secret})
            response = conn.getresponse()
            if response.status != 200:
                _check(response, f"fetching {name} of part {part}")
            with open(target, "wb") as out:
                shutil.copyfileobj(response, out, _BLOCK)
            if os.stat(target).st_size != entry.get("size"):
                raise CheckpointError(
                    f"{name} of part {part} arrived with {os.stat(target).st_size} bytes, "
                    f"its manifest says {entry.get('size')}"
                )
    finally:
        conn.close()


def fetch_part(address: str, secret: str, part: int, step: int, into: Path) -> dict[str, Any]:
    """Fetches committed part ``part`` of ``step`` from the tier at
    ``address`` into directory ``into``; returns its manifest."""
    manifest = fetch_manifest(address, secret, part, step)
    fetch_files(address, secret, part, step, manifest, into)
    return manifest


def merged_manifest(parts: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """The manifest of a whole snapshot from its parts' (part 0's metrics
    and metadata: rank 0's)."""
    first = min(parts, key=lambda m: m["part"])
    files: dict[str, Any] = {}
    for manifest in parts:
        for name, entry in manifest["files"].items():
            if name in files:
                raise CheckpointError(
                    f"two nodes wrote {name} into the memory snapshot of step {step}: give "
                    "each rank's files their own names"
                )
            files[name] = entry
    merged = {
        k: v for k, v in first.items() if k not in ("part", "ranks", "files", "blake3", "format")
    }
    merged.update({"format": FORMAT, "step": step, "files": dict(sorted(files.items()))})
    merged["blake3"] = _native.hash_bytes(canonical(merged))
    return merged


def assemble_into(
    tmp: Path,
    choice: dict[str, Any],
    node_tier: Path,
    holders: dict[int, tuple[str, str]],
    room: Any,
) -> dict[str, Any]:
    """Puts snapshot ``choice`` (``step``, ``id``, ``parts``) together in
    directory ``tmp``: the parts this node holds copied, the others fetched
    from ``holders`` (part -> (address, secret)), once ``room(bytes)`` said
    the whole fits (it raises if not). Returns its manifest (written there)."""
    step = choice["step"]
    sources: list[tuple[int, dict[str, Any], Path | None]] = []
    for part in range(choice["parts"]):
        local = part_root(node_tier, part) / step_name(step)
        manifest, _ = read_manifest(local, step)
        if manifest is not None and manifest.get("id") == choice["id"]:
            sources.append((part, manifest, local))
        elif part in holders:
            manifest = fetch_manifest(*holders[part], part, step)
            if manifest.get("id") != choice["id"]:
                raise CheckpointError(
                    f"node {holders[part][0]} now holds another save of part {part} of step {step}"
                )
            sources.append((part, manifest, None))
        else:
            raise CheckpointError(f"no live node holds part {part} of step {step}")
    merged = merged_manifest([manifest for _, manifest, _ in sources], step)
    room(sum(entry["size"] for entry in merged["files"].values()))
    for part, manifest, local in sources:
        if local is None:
            fetch_files(*holders[part], part, step, manifest, tmp)
            continue
        for name in manifest["files"]:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local / name, tmp / name)
    write_atomic(tmp / MANIFEST, (json.dumps(merged, indent=1, sort_keys=True) + "\n").encode())
    return merged


class Replicator:
    """Sends this node's committed parts to the peer node, one at a time in
    a thread, the newest first: a part committed while one is on its way
    replaces any other that waits. ``peer()`` gives the peer's (address,
    secret), or None while it has none."""

    def __init__(self, peer: Any) -> None:
        self._peer = peer
        self._cond = threading.Condition()
        self._waiting: tuple[Path, int, int] | None = None
        self._busy = False
        self._closed = False
        self._failing: str | None = None
        self._thread: threading.Thread | None = None

    def submit(self, part_dir: Path, part: int, step: int) -> None:
        with self._cond:
            self._waiting = (part_dir, part, step)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="relaunch-tier-replica", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Waits until nothing is waiting or on its way; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._waiting is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                job, self._waiting, self._busy = self._waiting, None, True
            try:
                self._send(*job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, part_dir: Path, part: int, step: int) -> None:
        try:
            peer = self._peer()
            if peer is None:
                raise CheckpointError("the next node has not published its memory tier")
            send_part(peer[0], peer[1], part_dir, part, step)
        except FileNotFoundError:
            return  # pruned meanwhile: a newer part is on its way
        except Exception as e:  # the job goes on; the peer keeps its older replica
            why = f"{type(e).__name__}: {e}"
            if self._failing is None:
                print(
                    f"relaunch.Checkpointer: warning: part {part} of the memory snapshot of step "
                    f"{step} was not replicated to the next node ({why}); it keeps the replica "
                    "before, and a node lost now resumes from there or from disk",
                    file=sys.stderr,
                    flush=True,
                )
            self._failing = why
            return
        if self._failing is not None:
            print(
                f"relaunch.Checkpointer: memory snapshots are replicated to the next node again "
                f"(step {step})",
                file=sys.stderr,
                flush=True,
            )
            self._failing = None


# --- one Checkpointer's view of the tier across nodes ------------------------------------


class Parts:
    """The memory tier of a Checkpointer whose job spans ``nodes`` nodes:
    this node's part tier (where its saves go), the whole snapshots put
    together after a restart (``whole``, the node's tier directory) and, on
    the node leader, the tier's server and replicator."""

    def __init__(
        self, whole: Any, node: int, nodes: int, local_rank: int, local_world: int
    ) -> None:
        self.whole = whole
        self.node_tier: Path = whole.root
        self.node, self.nodes = node, nodes
        self.local_rank, self.local_world = local_rank, local_world
        self.leader = local_rank == 0
        self.tier = Tier(
            "memory",
            part_root(self.node_tier, node),
            keep_last=KEEP,
            budget=whole.budget,
            durable=False,
            node_root=whole.node_root,
        )
        self.tier.root.mkdir(exist_ok=True)
        self.server: TierServer | None = None
        self.replicator: Replicator | None = None
        self.peer: tuple[str, str] | None = None
        # Calls of latest() so far: each agrees under keys of its own.
        self.rounds = 0

    def start_serving(self, publish: Any) -> None:
        """Node leader: serves this node's tier and publishes its address
        and secret with ``publish(text)``."""
        if not self.leader:
            return
        self.server = TierServer(
            self.node_tier, local_address(), self.whole.budget, self.whole.node_root
        )
        publish(json.dumps({"address": self.server.address, "secret": self.server.secret}))
        self.replicator = Replicator(lambda: self.peer)

    def committed(self, final: Path, step: int, peer: Any) -> None:
        """Node leader, after this node's part of ``step`` is committed in
        ``final`` (and the whole save): drops the snapshot put together at
        the restart, and sends the part to the next node (``peer()`` looks its
        address up while none is known)."""
        if not self.leader:
            return
        for _, path in self.whole.step_dirs():
            remove(path)
        if self.replicator is None:
            return
        if self.peer is None:
            self.peer = peer()
        self.replicator.submit(final, self.node, step)

    def room_for_whole(self, size: int) -> None:
        """Raises unless the node's tier has room for a whole snapshot of
        ``size`` bytes beside what it holds."""
        budget = self.whole.budget
        if budget is None:
            return
        used = tree_size(self.whole.node_root)
        if used + size > budget:
            raise CheckpointError(
                f"the node's memory tier has no room to put the snapshot together: it holds "
                f"{used} of its {budget} bytes (--snapshot-memory), the snapshot takes {size}"
            )

    def close(self) -> None:
        if self.replicator is not None:
            self.replicator.close()
        if self.server is not None:
            self.server.close()


def node_layout(world_size: int) -> tuple[int, int, int, int] | None:
    """(node, nodes, local rank, local world size) from the launcher's
    environment where the job spans several nodes of the same size, else None."""
    values = [
        os.environ.get(k, "").strip() for k in ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    ]
    if not all(v.isdigit() for v in values):
        return None
    node, local_rank, local_world = map(int, values)
    if local_world < 1 or local_world >= world_size or world_size % local_world:
        return None
    return node, world_size // local_world, local_rank, local_world


def part_roots(node_tier: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(node_tier) if PART_DIR.match(e.name)]
    except FileNotFoundError:
        return []
