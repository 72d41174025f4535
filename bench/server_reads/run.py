"""Big requests against a small writer, on one `relaunch server`.

While one logging client POSTs a batch of 100 points every 20 ms, a burst of

- `series`: `--readers` concurrent series reads of `--buckets` buckets of
  one run filled with `--points` points over 3 keys;
- `ingest`: `--ingesters` concurrent clients each POSTing `--ingest-batches`
  batches of about `--ingest-mib` MiB into runs of their own;
- `listings`: `--listers` concurrent listings of `--runs` runs (`GET
  /runs?limit=N`; the runs are created first, 8 clients at once).

    .venv/bin/python bench/server_reads/run.py [--relaunch PATH]
        [--scenario series|ingest|listings|all] [--points 1500000]
        [--readers 64] [--buckets 100000] [--ingesters 4] [--ingest-mib 56]
        [--ingest-batches 2] [--runs 100000] [--listers 16] [-- SERVER_ARGS...]

Each scenario starts its own server (`relaunch server`, the one on PATH
unless --relaunch names another binary) on loopback with a temporary data
directory. Reports the server's peak RSS during the burst, its RSS 5 s
after, the logging client's batch latency during the burst (p50, p99,
max: the target is p99 < 100 ms) and the burst's throughput. Arguments
after `--` go to the server. Prints one JSON object per scenario; all are
written to bench/out/server_reads.json.
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
CTYPE = "application/x-relaunch-batch"


def str16(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def batch(writer: str, first_seq: int, first_step: int, steps: int) -> bytes:
    """RLB3 (crates/relaunch-api/src/batch.rs): `steps` records of every key."""
    from relaunch import _native

    parts = [b"RLB3", str16(writer), str16("t"), struct.pack("<I", steps)]
    wall = time.time()
    for i in range(steps):
        step = first_step + i
        parts.append(struct.pack("<QBqdIH", first_seq + i, 1, step, wall, 0, len(KEYS)))
        for j, key in enumerate(KEYS):
            parts.append(str16(key) + struct.pack("<d", float(step * 7 + j) % 1000.0))
    body = b"".join(parts)
    return body + struct.pack("<I", _native.crc32c(body))


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


class Server:
    """A `relaunch server` on loopback with a temporary data directory."""

    def __init__(self, relaunch: str, server_args: list[str]) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="relaunch-server-reads-"))
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                relaunch,
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data),
                "--durability",
                "process",
                *server_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_ready(self.port, time.monotonic() + 30)

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)

    def open_run(self, conn: http.client.HTTPConnection, run: str) -> None:
        body = json.dumps({"project": "bench", "id": run, "attempt_token": "t"}).encode()
        post(conn, "/api/v1/runs", body, "application/json")

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.data, ignore_errors=True)


def burst(server: Server, workers: list, first_step: int) -> dict:
    """Runs `workers` (callables taking a connection, all released together)
    while a logging client POSTs 100 steps every 20 ms into run RUN from
    `first_step` on; returns the burst's time, the logger's latencies
    during it and the server's peak RSS and threads."""
    pid = server.proc.pid
    path = f"/api/v1/runs/{RUN}/batches"
    stop = threading.Event()
    during = threading.Event()
    latencies: list[float] = []
    errors: list[BaseException] = []

    def logger() -> None:
        c = server.conn()
        seq, step = 1, first_step
        while not stop.is_set():
            t = time.monotonic()
            post(c, path, batch("logger", seq, step, 100), CTYPE)
            if during.is_set():
                latencies.append(time.monotonic() - t)
            seq, step = seq + 100, step + 100
            time.sleep(max(0.0, 0.02 - (time.monotonic() - t)))

    peak = [0, 0]

    def sampler() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(pid))
            peak[1] = max(peak[1], threads(pid))
            time.sleep(0.01)

    go = threading.Barrier(len(workers) + 1)

    def work(fn) -> None:
        c = server.conn()
        go.wait()
        try:
            fn(c)
        except BaseException as e:  # reported after the burst
            errors.append(e)

    bg = [threading.Thread(target=logger), threading.Thread(target=sampler)]
    for t in bg:
        t.start()
    time.sleep(0.5)
    threads_ = [threading.Thread(target=work, args=(fn,)) for fn in workers]
    for t in threads_:
        t.start()
    during.set()
    go.wait()
    took = time.monotonic()
    for t in threads_:
        t.join()
    took = time.monotonic() - took
    during.clear()
    stop.set()
    for t in bg:
        t.join()
    if errors:
        raise errors[0]
    time.sleep(5)
    ms = sorted(x * 1000 for x in latencies)
    return {
        "burst_s": round(took, 2),
        "rss_peak_mib": round(peak[0] / 1024, 1),
        "rss_after_5s_mib": round(rss_kib(pid) / 1024, 1),
        "rss_anon_after_5s_mib": round(rss_anon_kib(pid) / 1024, 1),
        "threads_peak": peak[1],
        "threads_after": threads(pid),
        "logger_batches": len(ms),
        "logger_p50_ms": round(statistics.median(ms), 1) if ms else None,
        "logger_p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1) if ms else None,
        "logger_max_ms": round(ms[-1], 1) if ms else None,
    }


def series(a: argparse.Namespace) -> dict:
    server = Server(a.relaunch, a.server_args)
    try:
        conn = server.conn()
        server.open_run(conn, RUN)
        steps = a.points // len(KEYS)
        path = f"/api/v1/runs/{RUN}/batches"
        filled = time.monotonic()
        for first in range(0, steps, 10_000):
            n = min(10_000, steps - first)
            post(conn, path, batch("fill", first + 1, first, n), CTYPE)
        filled = time.monotonic() - filled
        time.sleep(2)
        rss_before = rss_kib(server.proc.pid)
        read_bytes = [0] * a.readers
        read_times = [0.0] * a.readers

        def reader(i: int):
            def read(c: http.client.HTTPConnection) -> None:
                t = time.monotonic()
                key = KEYS[i % len(KEYS)]
                c.request("GET", f"/api/v1/runs/{RUN}/series?key={key}&buckets={a.buckets}")
                r = c.getresponse()
                got = r.read()
                if r.status != 200:
                    raise RuntimeError(f"series: {r.status} {got[:300]!r}")
                read_times[i] = time.monotonic() - t
                read_bytes[i] = len(got)

            return read

        out = burst(server, [reader(i) for i in range(a.readers)], steps)
        return {
            "scenario": "series",
            "points": steps * len(KEYS),
            "fill_s": round(filled, 2),
            "readers": a.readers,
            "buckets": a.buckets,
            "rss_before_mib": round(rss_before / 1024, 1),
            **out,
            "reads_per_s": round(a.readers / out["burst_s"], 2),
            "read_mib_per_s": round(sum(read_bytes) / out["burst_s"] / 2**20, 1),
            "read_p50_s": round(statistics.median(read_times), 2),
            "read_max_s": round(max(read_times), 2),
        }
    finally:
        server.close()


def ingest(a: argparse.Namespace) -> dict:
    server = Server(a.relaunch, a.server_args)
    try:
        conn = server.conn()
        server.open_run(conn, RUN)
        for i in range(a.ingesters):
            server.open_run(conn, f"big-{i}")
        # About 73 bytes a step (3 keys): steps for --ingest-mib MiB.
        per_batch = a.ingest_mib * 2**20 // len(batch("x", 1, 0, 1))
        bodies = [
            [
                batch(f"big-{i}", 1 + j * per_batch, j * per_batch, per_batch)
                for j in range(a.ingest_batches)
            ]
            for i in range(a.ingesters)
        ]
        sent = sum(len(b) for bs in bodies for b in bs)
        rss_before = rss_kib(server.proc.pid)

        def ingester(i: int):
            def send(c: http.client.HTTPConnection) -> None:
                for body in bodies[i]:
                    post(c, f"/api/v1/runs/big-{i}/batches", body, CTYPE)

            return send

        out = burst(server, [ingester(i) for i in range(a.ingesters)], 0)
        return {
            "scenario": "ingest",
            "ingesters": a.ingesters,
            "batches_each": a.ingest_batches,
            "batch_mib": round(len(bodies[0][0]) / 2**20, 1),
            "rss_before_mib": round(rss_before / 1024, 1),
            **out,
            "ingest_mib_per_s": round(sent / out["burst_s"] / 2**20, 1),
        }
    finally:
        server.close()


def listings(a: argparse.Namespace) -> dict:
    server = Server(a.relaunch, a.server_args)
    try:
        conn = server.conn()
        server.open_run(conn, RUN)
        filled = time.monotonic()

        def create(part: int) -> None:
            c = server.conn()
            for i in range(part, a.runs, 8):
                body = json.dumps(
                    {
                        "project": "bench",
                        "id": f"r{i:06d}",
                        "attempt_token": "t",
                        "config": {"lr": i / a.runs, "layers": i % 12},
                    }
                ).encode()
                post(c, "/api/v1/runs", body, "application/json")

        makers = [threading.Thread(target=create, args=(k,)) for k in range(8)]
        for t in makers:
            t.start()
        for t in makers:
            t.join()
        filled = time.monotonic() - filled
        rss_before = rss_kib(server.proc.pid)
        read_bytes = [0] * a.listers

        def lister(i: int):
            def read(c: http.client.HTTPConnection) -> None:
                c.request("GET", f"/api/v1/runs?limit={a.runs + 1}")
                r = c.getresponse()
                got = r.read()
                if r.status != 200:
                    raise RuntimeError(f"listing: {r.status} {got[:300]!r}")
                read_bytes[i] = len(got)

            return read

        out = burst(server, [lister(i) for i in range(a.listers)], 0)
        return {
            "scenario": "listings",
            "runs": a.runs,
            "create_s": round(filled, 2),
            "listers": a.listers,
            "listing_mib": round(read_bytes[0] / 2**20, 1),
            "rss_before_mib": round(rss_before / 1024, 1),
            **out,
            "listings_per_s": round(a.listers / out["burst_s"], 2),
        }
    finally:
        server.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--relaunch", default=shutil.which("relaunch") or "relaunch")
    p.add_argument("--scenario", choices=["series", "ingest", "listings", "all"], default="all")
    p.add_argument("--points", type=int, default=1_500_000, help="points in all, over 3 keys")
    p.add_argument("--readers", type=int, default=64)
    p.add_argument("--buckets", type=int, default=100_000)
    p.add_argument("--ingesters", type=int, default=4)
    p.add_argument("--ingest-mib", type=int, default=56)
    p.add_argument("--ingest-batches", type=int, default=2)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--listers", type=int, default=16)
    p.add_argument("server_args", nargs="*")
    a = p.parse_args()
    scenarios = {"series": series, "ingest": ingest, "listings": listings}
    chosen = list(scenarios) if a.scenario == "all" else [a.scenario]
    results = []
    for name in chosen:
        result = {"server": a.relaunch, "server_args": a.server_args, **scenarios[name](a)}
        print(json.dumps(result), flush=True)
        results.append(result)
    write_result("server_reads", results)


if __name__ == "__main__":
    main()
