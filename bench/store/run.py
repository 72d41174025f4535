"""The store benchmark: relaunch's store against PyTorch's own TCPStore server
(libuv backend), same workloads, same run, reported as ratios.

    .venv/bin/python bench/store/run.py [--repeat 3] [--seconds 3] [--quick]

Both servers listen on 127.0.0.1 in their own processes. Each workload runs
against one server, then the other, `--repeat` times alternately; the
median is reported. Loads:
- torch's Python client (`pyclients.py`): N forked processes, one
  `torch.distributed.TCPStore` client each;
- `store-load` (Rust, one process, one thread): N wire-protocol clients.
Results go to stdout as a markdown table and to bench/out/store.json. The
ratio is relaunch's advantage: above 1 means relaunch is faster (more ops/s,
or fewer microseconds or seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))

from conftest import TorchServer  # noqa: E402

from relaunch._subprocess import StoreProcess  # noqa: E402

HERE = Path(__file__).resolve().parent


def fmt(value: float, unit: str) -> str:
    digits = {"s": 3, "us": 1}.get(unit, 0)
    return f"{value:,.{digits}f} {unit}"


def build_load_generator() -> Path:
    env = dict(os.environ)
    target = Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    subprocess.run(
        ["cargo", "build", "--release", "--quiet", "-p", "relaunch-bench-store"],
        cwd=ROOT,
        check=True,
    )
    return target / "release" / "store-load"


def run_json(cmd: list[str], timeout: float = 600) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


class Bench:
    def __init__(self, load: Path, repeat: int, seconds: float):
        self.load = load
        self.repeat = repeat
        self.seconds = seconds
        self.rows: list[dict] = []

    def measure(self, name: str, unit: str, better: str, ports: dict, make_cmd, key: str):
        """Runs `make_cmd(port)` against each server, alternately, and keeps the median."""
        self.compare(
            name, unit, better, {side: (lambda p=p: make_cmd(p)) for side, p in ports.items()}, key
        )

    def compare(self, name: str, unit: str, better: str, commands: dict, key: str):
        """Runs each side's command, alternately, `repeat` times; keeps the medians.
        The sides are "relaunch" and "torch"."""
        samples: dict[str, list[float]] = {side: [] for side in commands}
        for _ in range(self.repeat):
            for side, make in commands.items():
                samples[side].append(run_json(make())[key])
        med = {server: statistics.median(v) for server, v in samples.items()}
        ours, theirs = med["relaunch"], med["torch"]
        ratio = ours / theirs if better == "higher" else theirs / ours
        row = dict(name=name, unit=unit, relaunch=ours, torch=theirs, ratio=ratio, samples=samples)
        self.rows.append(row)
        print(
            f"{name:<52} relaunch {fmt(ours, unit)}  torch {fmt(theirs, unit)}  "
            f"ratio {ratio:5.2f}x",
            flush=True,
        )

    def py(self, *args: str) -> list[str]:
        return [sys.executable, str(HERE / "pyclients.py"), *args]

    def rs(self, port: int, *args: str) -> list[str]:
        return [str(self.load), "--port", str(port), *args]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--clients", default="1,16,64,256")
    p.add_argument("--storm", default="1024,4096")
    p.add_argument("--quick", action="store_true", help="one repeat of 1 s each")
    a = p.parse_args()
    if a.quick:
        a.repeat, a.seconds = 1, 1.0
    clients = [int(x) for x in a.clients.split(",")]
    storms = [int(x) for x in a.storm.split(",")]
    s = str(a.seconds)

    load = build_load_generator()
    ours = StoreProcess("127.0.0.1", 0)
    theirs = TorchServer()
    ports = {"relaunch": ours.port, "torch": theirs.port}
    bench = Bench(load, a.repeat, a.seconds)
    started = time.time()
    try:
        print(f"# store benchmark, {os.cpu_count()} CPUs, median of {a.repeat}", flush=True)
        for op in ["add", "get"]:
            bench.measure(
                f"latency {op}, torch Python client" + (" (WAIT+GET)" if op == "get" else ""),
                "us",
                "lower",
                ports,
                lambda port, op=op: bench.py("latency", "--port", str(port), "--op", op),
                "mean_us",
            )
        for op in ["add", "get"]:
            bench.measure(
                f"latency {op}, Rust client",
                "us",
                "lower",
                ports,
                lambda port, op=op: bench.rs(port, "latency", "--op", op),
                "mean_us",
            )
        for n in clients:
            bench.measure(
                f"add throughput, {n} torch Python client processes",
                "ops/s",
                "higher",
                ports,
                lambda port, n=n: bench.py(
                    "throughput", "--port", str(port), "--clients", str(n), "--seconds", s
                ),
                "ops_per_s",
            )
        for n in clients:
            bench.measure(
                f"add throughput, {n} Rust clients (store-load)",
                "ops/s",
                "higher",
                ports,
                lambda port, n=n: bench.rs(port, "throughput", "--clients", str(n), "--seconds", s),
                "ops_per_s",
            )
        # The same server (ours), two clients: torch's and relaunch.Store, as
        # threads of one process, beside a busy Python thread or not.
        for busy in [False, True]:
            for n in [1, 8]:
                flags = ["--busy"] if busy else []

                def side(kind, n=n, flags=flags):
                    return lambda: bench.py(
                        "threads", "--port", str(ports["relaunch"]), "--clients", str(n),
                        "--seconds", s, "--client", kind, *flags,
                    )  # fmt: skip

                bench.compare(
                    f"client threads: {n}, busy Python thread: {'yes' if busy else 'no'}"
                    " (relaunch.Store vs torch's client, our server)",
                    "ops/s",
                    "higher",
                    {"relaunch": side("relaunch"), "torch": side("torch")},
                    "ops_per_s",
                )
        for n in storms:
            bench.measure(
                f"connection storm, {n} clients: all released after",
                "s",
                "lower",
                ports,
                lambda port, n=n: bench.rs(port, "storm", "--clients", str(n)),
                "seconds",
            )
    finally:
        ours.stop()
        theirs.stop()

    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(exist_ok=True)
    result = {
        "started": started,
        "cpus": os.cpu_count(),
        "repeat": a.repeat,
        "seconds": a.seconds,
        "rows": bench.rows,
    }
    (out_dir / "store.json").write_text(json.dumps(result, indent=2))
    print("\n| workload | relaunch | torch | ratio |\n|---|---|---|---|")
    for r in bench.rows:
        print(
            f"| {r['name']} | {fmt(r['relaunch'], r['unit'])} | {fmt(r['torch'], r['unit'])} "
            f"| {r['ratio']:.2f}x |"
        )


if __name__ == "__main__":
    main()
