"""Heavy reads against ingest: a burst of large series reads while a client
logs, on one `relaunch server`.

    .venv/bin/python bench/server_reads/run.py [--relaunch PATH] [--points 1500000]
        [--readers 64] [--buckets 100000] [-- SERVER_ARGS...]

Starts the server (`relaunch server`, the one on PATH unless --relaunch
names another binary) on loopback with a temporary data directory, fills
one run with `--points` points over 3 keys through the batch API, then
runs `--readers` concurrent series reads of `--buckets` buckets (each
reader reads once, all start together) while one logging client POSTs a
batch of 100 points every 20 ms. Reports the server's peak RSS during the
burst, its RSS 5 s after the burst, ingest batch latency (p50, max) during
the burst, and read throughput. Arguments after `--` go to the server.
Prints one JSON object; also written to bench/out/server_reads.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import free_port, write_result  # noqa: E402

KEYS = ["loss", "grad_norm", "lr"]
RUN = "heavy"


def str16(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def batch(writer: str, first_seq: int, first_step: int, steps: int) -> bytes:
    """RLB2 (crates/relaunch-api/src/batch.rs): `steps` records of every key."""
    parts = [b"RLB2", str16(writer), str16("t"), struct.pack("<I", steps)]
    wall = time.time()
    for i in range(steps):
        step = first_step + i
        parts.append(struct.pack("<QBqdIH", first_seq + i, 1, step, wall, 0, len(KEYS)))
        for j, key in enumerate(KEYS):
            parts.append(str16(key) + struct.pack("<d", float(step * 7 + j) % 1000.0))
    return b"".join(parts)


def post(conn: http.client.HTTPConnection, path: str, body: bytes, ctype: str) -> None:
    conn.request("POST", path, body, {"Content-Type": ctype})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {data[:300]!r}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def rss_anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def wait_ready(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/api/v1/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--relaunch", default=shutil.which("relaunch") or "relaunch")
    p.add_argument("--points", type=int, default=1_500_000, help="points in all, over 3 keys")
    p.add_argument("--readers", type=int, default=64)
    p.add_argument("--buckets", type=int, default=100_000)
    p.add_argument("server_args", nargs="*")
    a = p.parse_args()

    data = Path(tempfile.mkdtemp(prefix="relaunch-server-reads-"))
    port = free_port()
    server = subprocess.Popen(
        [
            a.relaunch,
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--durability",
            "process",
            *a.server_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(port, time.monotonic() + 30)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        body = json.dumps({"project": "bench", "id": RUN, "attempt_token": "t"}).encode()
        post(conn, "/api/v1/runs", body, "application/json")
        steps = a.points // len(KEYS)
        path = f"/api/v1/runs/{RUN}/batches"
        ctype = "application/x-relaunch-batch"
        filled = time.monotonic()
        for first in range(0, steps, 10_000):
            n = min(10_000, steps - first)
            post(conn, path, batch("fill", first + 1, first, n), ctype)
        filled = time.monotonic() - filled
        time.sleep(2)
        rss_before = rss_kib(server.pid)

        # The logging client: one batch of 100 steps every 20 ms until told.
        stop = threading.Event()
        latencies: list[float] = []
        during = threading.Event()

        def logger() -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            seq, step = 1, steps
            while not stop.is_set():
                t = time.monotonic()
                post(c, path, batch("logger", seq, step, 100), ctype)
                if during.is_set():
                    latencies.append(time.monotonic() - t)
                seq, step = seq + 100, step + 100
                time.sleep(max(0.0, 0.02 - (time.monotonic() - t)))

        # The memory sampler: peak RSS during the burst.
        peak = [0, 0]

        def sampler() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_kib(server.pid))
                peak[1] = max(peak[1], threads(server.pid))
                time.sleep(0.01)

        read_bytes = [0] * a.readers
        read_times = [0.0] * a.readers
        go = threading.Barrier(a.readers + 1)

        def reader(i: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            key = KEYS[i % len(KEYS)]
            go.wait()
            t = time.monotonic()
            c.request("GET", f"/api/v1/runs/{RUN}/series?key={key}&buckets={a.buckets}")
            r = c.getresponse()
            got = r.read()
            if r.status != 200:
                raise RuntimeError(f"series: {r.status} {got[:300]!r}")
            read_times[i] = time.monotonic() - t
            read_bytes[i] = len(got)

        bg = [threading.Thread(target=logger), threading.Thread(target=sampler)]
        for t in bg:
            t.start()
        time.sleep(0.5)
        readers = [threading.Thread(target=reader, args=(i,)) for i in range(a.readers)]
        for t in readers:
            t.start()
        during.set()
        go.wait()
        burst = time.monotonic()
        for t in readers:
            t.join()
        burst = time.monotonic() - burst
        during.clear()
        stop.set()
        for t in bg:
            t.join()
        time.sleep(5)
        result = {
            "server": a.relaunch,
            "server_args": a.server_args,
            "points": steps * len(KEYS),
            "fill_s": round(filled, 2),
            "readers": a.readers,
            "buckets": a.buckets,
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_peak_mib": round(peak[0] / 1024, 1),
            "rss_after_5s_mib": round(rss_kib(server.pid) / 1024, 1),
            "rss_anon_after_5s_mib": round(rss_anon_kib(server.pid) / 1024, 1),
            "threads_peak": peak[1],
            "threads_after": threads(server.pid),
            "ingest_batches": len(latencies),
            "ingest_p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
            "ingest_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
            "burst_s": round(burst, 2),
            "reads_per_s": round(a.readers / burst, 2),
            "read_mib_per_s": round(sum(read_bytes) / burst / 2**20, 1),
            "read_p50_s": round(statistics.median(read_times), 2),
            "read_max_s": round(max(read_times), 2),
        }
        print(json.dumps(result))
        write_result("server_reads", result)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
