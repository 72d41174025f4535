"""torch's own Python TCPStore client as a load: N client processes doing `add`.

Imports torch once, then forks N children (sharing torch's memory, so 256 of
them fit on a small machine); each child opens its own
``torch.distributed.TCPStore`` client. Prints one JSON object.

    python pyclients.py throughput --port P --clients N [--seconds S]
    python pyclients.py latency --port P [--op add|get] [--iterations N]
    python pyclients.py threads --port P --clients N --client torch|relaunch [--busy]

`threads` runs N client threads in one process, optionally beside a Python
thread that never blocks (as a training loop does): the case where a client
that releases the GIL for every round trip waits a whole switch interval to
get it back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))


def latency(port: int, op: str, iterations: int) -> dict:
    s = client(port)
    s.set("bench/value", b"x" * 64)
    call = (lambda: s.add("bench/latency", 1)) if op == "add" else (lambda: s.get("bench/value"))
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "mode": "latency",
        "op": op,
        "mean_us": sum(samples) / len(samples) * 1e6,
        "p50_us": samples[len(samples) // 2] * 1e6,
        "p99_us": samples[len(samples) * 99 // 100] * 1e6,
    }


def throughput(port: int, clients: int, seconds: float) -> dict:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pids = []
    for i in range(clients):
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                s = client(port)
                key = f"bench/throughput/{i % 16}"
                os.write(ready_w, b"r")
                os.read(go_r, 1)
                n, end = 0, time.perf_counter() + seconds
                while time.perf_counter() < end:
                    s.add(key, 1)
                    n += 1
                os.write(done_w, f"{n}\n".encode())
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for _ in range(clients):
        os.read(ready_r, 1)
    os.write(go_w, b"g" * clients)
    total, lines = 0, b""
    while lines.count(b"\n") < clients:
        lines += os.read(done_r, 65536)
    total = sum(int(x) for x in lines.split())
    for pid in pids:
        os.waitpid(pid, 0)
    return {"mode": "throughput", "clients": clients, "ops_per_s": total / seconds}


def threads(port: int, clients: int, seconds: float, kind: str, busy: bool) -> dict:
    import threading

    if kind == "torch":
        stores = [client(port) for _ in range(clients)]
    else:
        import relaunch

        stores = [relaunch.Store("127.0.0.1", port, timeout=120) for _ in range(clients)]
    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            x += 1

    counts = [0] * clients
    end = time.perf_counter() + seconds

    def run(i: int) -> None:
        s, n = stores[i], 0
        while time.perf_counter() < end:
            s.add("bench/threads", 1)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    spinner = threading.Thread(target=spin, daemon=True)
    if busy:
        spinner.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    return {"mode": "threads", "client": kind, "busy": busy, "ops_per_s": sum(counts) / seconds}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["latency", "throughput", "threads"])
    p.add_argument("--client", choices=["torch", "relaunch"], default="torch")
    p.add_argument("--busy", action="store_true")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--op", choices=["add", "get"], default="add")
    p.add_argument("--iterations", type=int, default=5000)
    a = p.parse_args()
    if a.mode == "latency":
        out = latency(a.port, a.op, a.iterations)
    elif a.mode == "threads":
        out = threads(a.port, a.clients, a.seconds, a.client, a.busy)
    else:
        out = throughput(a.port, a.clients, a.seconds)
    print(json.dumps(out), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
