"""The memory tier over several nodes: each node commits its ranks' part of
a snapshot in its own launcher's tier and sends it to the next node; after
a restart every node puts the whole snapshot together, fetching what it
lacks from the node that holds it, the lost node's part from its replica.

The first tests speak to a node's tier server as a hostile peer would; the
last ones run DDP jobs on several ``relaunch run`` launchers on this
machine (each its own node with its own memory tier) and kill a rank, or a
whole node."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
from conftest import wait_for
from test_checkpoint_memory import (
    JOB,
    MEMORY_TRAIN,
    assert_same_final_state,
    run_job,
    steps_of,
)

import relaunch
from relaunch import _native
from relaunch._checkpoint_files import FORMAT, MANIFEST, canonical
from relaunch._checkpoint_peer import (
    HEADER,
    Replicator,
    TierServer,
    _PooledServer,
    committed_parts,
    fetch_part,
    newest_whole,
    send_part,
)
from relaunch.errors import CheckpointError

MiB = 2**20


def make_part(root: Path, part: int, parts: int, step: int, save_id: str, files: dict) -> Path:
    """A committed part as a node leader leaves it."""
    path = root / f"part_{part}" / f"step_{step:08d}"
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    manifest = {
        "format": FORMAT,
        "step": step,
        "part": part,
        "parts": parts,
        "id": save_id,
        "files": {n: {"size": len(d), "blake3": None} for n, d in files.items()},
    }
    manifest["blake3"] = _native.hash_bytes(canonical(manifest))
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


@pytest.fixture
def server(tmp_path: Path):
    launcher_dir = tmp_path / "launcher"
    node_tier = launcher_dir / "ckpt"
    node_tier.mkdir(parents=True)
    served = TierServer(node_tier, "127.0.0.1", 4 * MiB, launcher_dir)
    yield served
    served.close()


def ask(server: TierServer, method: str, path: str, body: bytes = b"", headers=None, timeout=30):
    host, port = server.address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        all_headers = {HEADER: server.secret, "Content-Length": str(len(body))}
        all_headers.update(headers or {})
        conn.request(method, path, body=body, headers=all_headers)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def raw(server: TierServer, line: str, length: int, body: bytes) -> bytes:
    """One request by hand (a Content-Length that lies), the answer."""
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        head = f"{line} HTTP/1.1\r\nHost: x\r\n{HEADER}: {server.secret}\r\n"
        s.sendall(f"{head}Content-Length: {length}\r\n\r\n".encode() + body)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


def test_a_replica_sent_arrives_whole_and_fetches_back(server: TierServer, tmp_path: Path) -> None:
    files = {"x.pt": os.urandom(3 * MiB + 5), "d/y": b"y"}
    source = make_part(tmp_path / "a", 1, 3, 7, "s-1", files)
    send_part(server.address, server.secret, source, 1, 7)
    replica = server.node_tier / "part_1" / "step_00000007"
    assert (replica / "x.pt").read_bytes() == (source / "x.pt").read_bytes()
    assert committed_parts(server.node_tier) == [{"part": 1, "parts": 3, "step": 7, "id": "s-1"}]
    into = tmp_path / "back"
    into.mkdir()
    manifest = fetch_part(server.address, server.secret, 1, 7, into)
    assert manifest["id"] == "s-1"
    assert (into / "d" / "y").read_bytes() == b"y"
    assert (into / "x.pt").read_bytes() == (source / "x.pt").read_bytes()
    # A newer replica of the same part: the two newest steps are kept.
    for step in (8, 9):
        newer = make_part(tmp_path / f"a{step}", 1, 3, step, f"s-{step}", {"x.pt": b"n"})
        send_part(server.address, server.secret, newer, 1, step)
    assert sorted(p.name for p in (server.node_tier / "part_1").iterdir()) == [
        "step_00000008",
        "step_00000009",
    ]


def test_hostile_requests_are_refused_and_leave_nothing(server: TierServer) -> None:
    status, said = ask(server, "GET", "/part_0/step_00000001/x", headers={HEADER: "wrong"})
    assert status == 403 and HEADER in said
    assert ask(server, "GET", "/part_0/step_00000001/../../../etc/passwd")[0] == 404
    assert ask(server, "GET", "/part_0/step_00000001/nothing")[0] == 404
    # More than the tier's budget: refused before the body is read.
    said = raw(server, "PUT /part_0/step_00000001.tmp-ab-cd/x", 5 * MiB, b"")
    assert said.startswith(b"HTTP/1.1 507") and b"memory tier full" in said, said
    # A body shorter than it said: the server gives up on it, keeps nothing.
    said = raw(server, "PUT /part_0/step_00000001.tmp-ab-cd/x", 100, b"only 20 bytes here..")
    assert said.startswith(b"HTTP/1.1 400") and b"short" in said, said
    assert not (server.node_tier / "part_0" / "step_00000001.tmp-ab-cd").exists()
    # A peer that stalls mid-body (a half-open link: no FIN, no bytes) holds
    # one of the server's threads, not the server.
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as stalled:
        stalled.sendall(
            b"PUT /part_0/step_00000001.tmp-ab-cd/y HTTP/1.1\r\nHost: x\r\n"
            + f"{HEADER}: {server.secret}\r\nContent-Length: 100\r\n\r\nten bytes!".encode()
        )
        # Answered long before the stalled one times out (20 s).
        assert ask(server, "GET", "/part_0/step_00000001/nothing", timeout=5)[0] == 404
    # A commit of a replica without its manifest: refused, nothing committed.
    assert ask(server, "PUT", "/part_0/step_00000001.tmp-ab-cd/x", b"data")[0] == 201
    status, said = ask(server, "POST", "/part_0/step_00000001.tmp-ab-cd")
    assert status == 409 and "not whole" in said
    assert committed_parts(server.node_tier) == []
    with pytest.raises(CheckpointError, match="HTTP 404"):
        fetch_part(server.address, server.secret, 0, 1, server.node_tier / "elsewhere")


def test_peers_that_trickle_their_headers_are_cut_off(tmp_path: Path) -> None:
    """As many peers as the server has threads send a request's headers a
    byte every 0.2 s: each is closed once its headers are 2 s late, and a
    real request is answered. Before, every byte restarted the 20 s idle
    timeout: the trickling peers held every thread for as long as they
    went on, and nothing else was served."""
    node_tier = tmp_path / "launcher" / "ckpt"
    node_tier.mkdir(parents=True)
    served = TierServer(node_tier, "127.0.0.1", 4 * MiB, tmp_path / "launcher", header_timeout=2)
    host, port = served.address.rsplit(":", 1)
    tricklers = [socket.create_connection((host, int(port))) for _ in range(_PooledServer.WORKERS)]
    stop = threading.Event()

    def trickle() -> None:
        head = f"GET /part_0/step_00000001/x HTTP/1.1\r\nX-Padding: {'a' * 1000}".encode()
        for i in range(len(head)):
            for s in tricklers:
                with contextlib.suppress(OSError):
                    s.send(head[i : i + 1])
            if stop.wait(0.2):
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        assert ask(served, "GET", "/part_0/step_00000001/nothing", timeout=15)[0] == 404
        for s in tricklers:
            s.settimeout(15)
            try:
                closed = s.recv(65536) == b""
            except ConnectionResetError:
                closed = True
            assert closed
    finally:
        stop.set()
        sender.join()
        for s in tricklers:
            s.close()
        served.close()


class CuttingProxy:
    """A TCP proxy to ``target`` that forwards ``budget`` bytes of what the
    client sends, then closes both sides: a link cut mid-transfer."""

    def __init__(self, target: str, budget: int) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.budget = budget
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._back, args=(upstream, client), daemon=True).start()
            while self.budget > 0:
                data = client.recv(min(65536, self.budget))
                if not data:
                    break
                upstream.sendall(data)
                self.budget -= len(data)
            for end in (client, upstream):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    @staticmethod
    def _back(upstream: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                client.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_a_replica_cut_mid_transfer_leaves_the_one_before(
    server: TierServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The peer keeps its replica of step 1 when step 2's is cut short; the
    sender says so once on stderr, and again when replicas go through."""
    first = make_part(tmp_path / "a", 0, 2, 1, "s-1", {"x.pt": os.urandom(MiB)})
    send_part(server.address, server.secret, first, 0, 1)
    proxy = CuttingProxy(server.address, 300_000)
    peer = [proxy.address]
    replicator = Replicator(lambda: (peer[0], server.secret))
    try:
        second = make_part(tmp_path / "b", 0, 2, 2, "s-2", {"x.pt": os.urandom(MiB)})
        replicator.submit(second, 0, 2)
        assert replicator.wait(60)
        assert committed_parts(server.node_tier) == [
            {"part": 0, "parts": 2, "step": 1, "id": "s-1"}
        ]
        err = capfd.readouterr().err
        assert "part 0 of the memory snapshot of step 2 was not replicated" in err, err
        # The link is back: the next snapshot's part goes through.
        peer[0] = server.address
        third = make_part(tmp_path / "c", 0, 2, 3, "s-3", {"x.pt": os.urandom(MiB)})
        replicator.submit(third, 0, 3)
        assert replicator.wait(60)
        steps = sorted(p["step"] for p in committed_parts(server.node_tier))
        assert steps == [1, 3]
        # What the cut transfer left is gone with the next commit.
        assert sorted(p.name for p in (server.node_tier / "part_0").iterdir()) == [
            "step_00000001",
            "step_00000003",
        ]
        assert "replicated to the next node again (step 3)" in capfd.readouterr().err
    finally:
        replicator.close()
        proxy.close()


def test_a_replica_the_peer_has_no_room_for_is_refused_and_said(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    launcher_dir = tmp_path / "launcher"
    (launcher_dir / "ckpt").mkdir(parents=True)
    small = TierServer(launcher_dir / "ckpt", "127.0.0.1", MiB, launcher_dir)
    replicator = Replicator(lambda: (small.address, small.secret))
    try:
        part = make_part(tmp_path / "a", 1, 2, 5, "s", {"x.pt": os.urandom(2 * MiB)})
        replicator.submit(part, 1, 5)
        assert replicator.wait(60)
        err = capfd.readouterr().err
        assert "HTTP 507: memory tier full" in err, err
        assert committed_parts(small.node_tier) == []
    finally:
        replicator.close()
        small.close()


def test_parts_of_different_saves_are_never_taken_for_one_snapshot() -> None:
    held = [
        {"part": 0, "parts": 2, "step": 9, "id": "new"},
        {"part": 1, "parts": 2, "step": 9, "id": "old"},  # step 9 of an earlier attempt
        {"part": 0, "parts": 2, "step": 8, "id": "a"},
        {"part": 1, "parts": 2, "step": 8, "id": "a"},
        {"part": 0, "parts": 3, "step": 10, "id": "b"},  # part 1 and 2 lost
    ]
    assert newest_whole(held) == {"step": 8, "id": "a", "parts": 2}
    assert newest_whole(held[:2]) is None


# --- real jobs over several launchers ----------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(
    tmp_path: Path, nodes: str, count: int, *args: str, kill=None
) -> tuple[Path, str, list[int]]:
    """``count`` launchers of memory_train.py, one rank each, on this
    machine (``--nnodes nodes``), each with its own memory tier under
    tmp_path/shm; ``kill(launchers, out)`` is called once they train."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "shm").mkdir()
    env = {**os.environ, "RELAUNCH_SNAPSHOT_ROOT": str(tmp_path / "shm")}
    env.pop("RELAUNCH_SNAPSHOT_DIR", None)
    port = free_port()
    command = [
        sys.executable, "-m", "relaunch", "run", "--nnodes", nodes, "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", tmp_path.name, "--rdzv-conf", "last_call_timeout=2",
        "--max-restarts", "1", "--monitor-interval", "0.2", "--shutdown-timeout", "5",
        "--snapshot-memory", "64MiB", str(MEMORY_TRAIN), str(out), "--ckpt-dir", str(out / "ckpt"),
        *args,
    ]  # fmt: skip
    launchers = []
    try:
        for i in range(count):
            launchers.append(
                subprocess.Popen(
                    command,
                    cwd=tmp_path,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
            if i == 0:
                wait_for(lambda: _listening(port), 60, "the first node to host the store")
        if kill is not None:
            wait_for(
                lambda: (
                    together(out, count) is not None or any(p.poll() is not None for p in launchers)
                ),
                180,
                f"all {count} ranks past step 30 in one attempt",
            )
            kill(launchers, out)
        outputs = [p.communicate(timeout=300)[0] for p in launchers]
    finally:
        for p in launchers:
            if p.poll() is None:
                p.kill()
                p.wait()
    output = "\n--- next node ---\n".join(outputs)
    (out / "launchers.log").write_text(output)
    return out, output, [p.returncode for p in launchers]


def together(out: Path, count: int) -> int | None:
    """The attempt in which all ``count`` ranks did 10 steps or more and
    reached step 30 (on a loaded machine an elastic job may start without
    its last node and admit it in a later attempt), or None."""
    done: dict[int, dict[int, list[int]]] = {}
    for rank in range(count):
        for attempt, step in steps_of(out, rank):
            done.setdefault(attempt, {}).setdefault(rank, []).append(step)
    for attempt, ranks in sorted(done.items(), reverse=True):
        if len(ranks) == count and all(len(s) >= 10 and s[-1] >= 30 for s in ranks.values()):
            return attempt
    return None


def after_losing_one(out: Path, attempt: int) -> tuple[list[int], int, int]:
    """After a node of three was lost in ``attempt``: the ranks that went
    on, the last step done in ``attempt`` and the first one done after."""
    steps = {r: steps_of(out, r) for r in range(3)}
    survivors = [r for r in range(3) if any(a > attempt for a, _ in steps[r])]
    last_before = max(s for r in range(3) for a, s in steps[r] if a == attempt)
    first_after = min((s for r in survivors for a, s in steps[r] if a > attempt), default=-1)
    return survivors, last_before, first_after


def resumed_after(out: Path, attempt: int) -> list[dict]:
    """Where the ranks of the first attempt after ``attempt`` resumed from."""
    later = [int(p.name.split(".")[1]) for p in out.glob("resumed.*.*")]
    first = min((a for a in later if a > attempt), default=None)
    return [json.loads(p.read_text()) for p in out.glob(f"resumed.{first}.*")]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def re_run_steps(out: Path, rank: int) -> set[int]:
    steps = steps_of(out, rank)
    first = {s for a, s in steps if a == 0}
    second = {s for a, s in steps if a == 1}
    return first & second


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job uninterrupted, on one node: the state the two-node run must end with."""
    pytest.importorskip("torch")
    return run_job(tmp_path_factory.mktemp("clean"), "clean", *JOB)


def test_over_two_nodes_a_killed_rank_resumes_from_memory(tmp_path: Path, clean_run: Path) -> None:
    """Rank 1, on node 1, is killed: both nodes restart; node 1 fetches
    the model (written by rank 0 into node 0's part) from node 0."""

    def kill_rank_1(launchers: list[subprocess.Popen], out: Path) -> None:
        for launcher in launchers:
            children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
            for child in children.read_text().split():
                env = Path(f"/proc/{child}/environ").read_bytes()
                if b"\0RANK=1\0" in env and b"RELAUNCH_ZYGOTE_FD" not in env:
                    os.kill(int(child), signal.SIGKILL)
                    return
        raise AssertionError("no rank 1")

    out, output, codes = run_nodes(tmp_path, "2", 2, *JOB, kill=kill_rank_1)
    assert codes == [0, 0], output
    assert "restarting" in output, output
    for rank in (0, 1):
        resumed = json.loads((out / f"resumed.1.{rank}").read_text())
        assert resumed["tier"] == "memory", output
        assert len(re_run_steps(out, rank)) <= 1, (rank, sorted(re_run_steps(out, rank)))
        assert steps_of(out, rank)[-1] == (1, 69)
    assert_same_final_state(clean_run, out)
    assert list((tmp_path / "shm").iterdir()) == []


def test_a_lost_node_resumes_from_its_replica_on_the_next_node(tmp_path: Path) -> None:
    """Three nodes; the last launcher started (not the first, whose store
    the job uses) is SIGKILLed with its worker and its memory tier (the
    node is gone). The two left resume from memory: the lost node's part
    of the snapshot from its replica on the next node."""

    lost_in = []

    def lose_a_node(launchers: list[subprocess.Popen], out: Path) -> None:
        lost_in.append(together(out, 3))
        launchers[-1].kill()

    out, output, codes = run_nodes(tmp_path, "2:3", 3, *JOB, kill=lose_a_node)
    assert codes == [0, 0, -signal.SIGKILL], output
    resumed = resumed_after(out, lost_in[0])
    assert len(resumed) == 2 and all(r["tier"] == "memory" for r in resumed), output
    assert "resuming from the memory snapshot of step" in output
    # Every step the lost world had done is in the snapshot or re-run: the
    # lost node's newest part may not have reached its replica (the copy
    # runs behind the step), so a step more than memory_every=1 may be re-run
    # (bench/preempt --only nodes measures it: 1 in every run).
    survivors, last_before, first_after = after_losing_one(out, lost_in[0])
    assert len(survivors) == 2, output
    assert 0 <= last_before - first_after + 1 <= 2, (last_before, first_after)
    assert all(steps_of(out, r)[-1][1] == 69 for r in survivors)


def test_a_host_cut_off_resumes_from_its_replica(hosts, tmp_path: Path) -> None:
    """Three hosts (network namespaces, ``--nnodes 2:3``); host 2's link
    goes down mid-run, silently: its launcher lives on, unreachable. The
    two left resume from memory, host 2's part from its replica."""
    from test_multihost import ELASTIC, RDZV_CONF, STORE_PORT, Launcher

    out = tmp_path / "out"
    out.mkdir()
    endpoint = f"{hosts[0].addr}:{STORE_PORT}"
    launchers = [
        Launcher(
            h, tmp_path / "logs", "run", "--nnodes", "2:3", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "cut-memory", "--rdzv-conf", RDZV_CONF, *ELASTIC,
            "--shutdown-timeout", "3", "--snapshot-memory", "64MiB",
            MEMORY_TRAIN, out, "--ckpt-dir", out / "ckpt", *JOB,
        )
        for h in hosts
    ]  # fmt: skip
    try:
        wait_for(lambda: together(out, 3) is not None, 180, "three hosts past step 30")
        cut_in = together(out, 3)
        hosts[2].cut()
        codes = [la.wait(timeout=240) for la in launchers[:2]]
        said = "\n".join(f"--- {la.host.name}:\n{la.stderr}" for la in launchers)
        assert codes == [0, 0], said
    finally:
        launchers[2].proc.kill()
        launchers[2].proc.wait()
    said = "\n".join(la.stderr + la.out.read_text() for la in launchers[:2])
    survivors, last_before, first_after = after_losing_one(out, cut_in)
    assert len(survivors) == 2, said
    resumed = resumed_after(out, cut_in)
    assert len(resumed) == 2 and all(r["tier"] == "memory" for r in resumed), said
    assert 0 <= last_before - first_after + 1 <= 2, (last_before, first_after)  # as above
    assert "resuming from the memory snapshot of step" in said


# --- two nodes in this process ---------------------------------------------------------


class TwoNodes:
    """Two nodes of one rank each in this process: each Checkpointer is
    made with its node's environment (node rank, its own memory tier), and
    the ranks' saves run in threads, through a real store."""

    def __init__(self, tmp_path: Path, store_port: int, monkeypatch, attempt: int = 0) -> None:
        self.tmp_path = tmp_path
        self.tiers = [tmp_path / f"node{n}" / "tier" for n in range(2)]
        self.ckpts = []
        monkeypatch.setenv("RELAUNCH_RUN_ID", "two-nodes")
        monkeypatch.setenv("RELAUNCH_ATTEMPT", str(attempt))
        monkeypatch.setenv("RELAUNCH_STORE", f"127.0.0.1:{store_port}")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("RELAUNCH_SNAPSHOT_MEMORY", str(64 * MiB))
        for node, tier in enumerate(self.tiers):
            tier.mkdir(parents=True, exist_ok=True)
            monkeypatch.setenv("GROUP_RANK", str(node))
            monkeypatch.setenv("RELAUNCH_SNAPSHOT_DIR", str(tier))
            self.ckpts.append(
                relaunch.Checkpointer(
                    tmp_path / "disk",
                    rank=node,
                    world_size=2,
                    save_every=1000,
                    memory_every=1,
                    timeout=60,
                )
            )

    def each(self, fn) -> list:
        """``fn(rank, ckpt)`` on both ranks at once; their results (or errors)."""
        results: list = [None, None]

        def run(rank: int) -> None:
            try:
                results[rank] = fn(rank, self.ckpts[rank])
            except BaseException as e:
                results[rank] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        return results

    def save(self, step: int) -> list[str]:
        """Both ranks save ``step``; the warnings they gave (an error raises)."""

        def one(rank: int, ckpt) -> None:
            with ckpt.save(step) as path:
                assert path is not None
                if rank == 0:
                    (path / "model.pt").write_bytes(step.to_bytes(4, "little") * 1000)
                (path / f"rank{rank}.pt").write_bytes(b"r" * 100)

        # Recorded here, around both threads: warnings' state is the process's.
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            results = self.each(one)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return [str(w.message) for w in said]

    def close(self) -> None:
        for ckpt in self.ckpts:
            ckpt.close()


def held_in(tier: Path) -> Path:
    """The checkpoint directory's own folder in a node's memory tier."""
    return next(p for p in tier.iterdir() if p.is_dir())


def test_two_nodes_resume_from_a_whole_snapshot_each_reads_every_file(
    tmp_path: Path, store_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = TwoNodes(tmp_path, store_server.port, monkeypatch)
    try:
        for step in (1, 2, 3):
            assert first.save(step) == []
        # Each node holds its own part and the other's replica.
        for node in (0, 1):
            wait_for(
                lambda node=node: {(p["part"], p["step"]) for p in committed_parts(
                    held_in(first.tiers[node]))} >= {(0, 3), (1, 3)},
                30,
                f"node {node} to hold both parts of step 3",
            )  # fmt: skip
    finally:
        first.close()
    # The next attempt: both nodes put step 3 together and read any file of it.
    second = TwoNodes(tmp_path, store_server.port, monkeypatch, attempt=1)
    try:
        found = second.each(lambda rank, ckpt: ckpt.latest())
        assert [c.step for c in found] == [3, 3] and [c.tier for c in found] == ["memory"] * 2
        for checkpoint in found:
            assert (checkpoint.path / "model.pt").read_bytes() == (3).to_bytes(4, "little") * 1000
            assert sorted(checkpoint.files) == [
                "model.pt", "rank0.pt", "rank1.pt", "rng_state.0.json", "rng_state.1.json"
            ]  # fmt: skip
        # Saving on drops the whole snapshot put together, keeps the parts.
        assert second.save(4) == []
        assert not found[1].path.exists()
    finally:
        second.close()


def test_a_node_without_room_skips_the_snapshot_on_every_rank_at_once(
    tmp_path: Path, store_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0 (rank 0, which announces the outcome) cannot fit its part:
    both ranks skip that snapshot with a warning, within seconds (before,
    rank 1 waited the whole timeout for an outcome rank 0 never set), and
    the next snapshot, of the same step's successor, commits."""
    nodes = TwoNodes(tmp_path, store_server.port, monkeypatch)
    try:
        assert nodes.save(1) == []
        # 1000 bytes left on node 0: its part of step 2 (4100 bytes) does not fit.
        filler = nodes.tiers[0] / "filler"
        held = sum(p.stat().st_size for p in nodes.tiers[0].rglob("*") if p.is_file())
        filler.write_bytes(b"f" * (64 * MiB - held - 1000))
        began = time.monotonic()
        said = nodes.save(2)
        assert time.monotonic() - began < 30
        assert len(said) == 2 and all("memory tier full" in w for w in said), said
        for tier in nodes.tiers:
            assert {p["step"] for p in committed_parts(held_in(tier))} == {1}
        filler.unlink()
        assert nodes.save(3) == []
    finally:
        nodes.close()


def test_a_step_saved_again_replaces_a_part_of_another_save(
    tmp_path: Path, store_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part of step 2 left from a save that was not whole (another node
    failed after this one committed) does not stop step 2 being saved
    again after the job resumed from step 1."""
    nodes = TwoNodes(tmp_path, store_server.port, monkeypatch)
    try:
        assert nodes.save(1) == []
        own = held_in(nodes.tiers[0]) / "part_0"
        left = make_part(tmp_path / "left", 0, 2, 2, "an-earlier-save", {"model.pt": b"old"})
        shutil.copytree(left, own / "step_00000002")
        assert nodes.save(2) == []
        assert (own / "step_00000002" / "model.pt").read_bytes() == (2).to_bytes(4, "little") * 1000
    finally:
        nodes.close()
