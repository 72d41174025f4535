"""The launcher benchmark: `relaunch run` against `torchrun`, same job, same run.

    .venv/bin/python bench/launch/run.py [--repeat 5] [--nproc 8] [--also NAME=BINARY]

Two figures, each the median of `--repeat` alternating runs:
- launcher overhead: wall time of `LAUNCHER --nproc-per-node 8 --no-python true`
  (8 workers that exit at once, so the time is the launcher's own);
- stop time: 8 `sleep` workers, SIGTERM to the launcher, time until the
  launcher has exited and no worker is left.
relaunch is measured as users run it (the native `relaunch` command the
wheel installs) and through Python (`python -m relaunch`, which starts an
interpreter and imports the package first). The ratio is relaunch's
advantage. ``--also NAME=BINARY`` times another ``relaunch`` binary (an
earlier build) in the same alternating runs, to compare builds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from relaunch._subprocess import alive, children

ROOT = Path(__file__).resolve().parents[2]

BIN = Path(sys.executable).parent


def overhead(cmd: list[str], nproc: int) -> float:
    start = time.perf_counter()
    subprocess.run(
        [*cmd, "--nproc-per-node", str(nproc), "--no-python", "true"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def stop_time(cmd: list[str], nproc: int) -> float:
    proc = subprocess.Popen(
        [*cmd, "--nproc-per-node", str(nproc), "--no-python", "sleep", "3600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < nproc:
            # torchrun's workers are children of its agent process.
            workers = [
                p for c in children(proc.pid) for p in [c, *children(c)] if _comm(p) == "sleep"
            ]
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]}: workers did not start")
            time.sleep(0.01)
        start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        while any(alive(w) for w in workers):
            time.sleep(0.001)
        return time.perf_counter() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--nproc", type=int, default=8)
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=BINARY",
        help="another relaunch binary (an earlier build) timed in the same runs",
    )
    a = p.parse_args()
    also = {}
    for spec in a.also:
        name, sep, binary = spec.partition("=")
        if not sep or not name or not Path(binary).is_file():
            p.error(f"--also wants NAME=BINARY, the path of a relaunch binary; got {spec!r}")
        also[name] = [binary, "run"]

    launchers = {
        "relaunch": [str(BIN / "relaunch"), "run"],
        "python -m relaunch": [sys.executable, "-m", "relaunch", "run"],
        **also,
        "torchrun": [shutil.which("torchrun", path=str(BIN)) or "torchrun"],
    }
    rows = []
    for name, fn in [("launcher overhead", overhead), ("SIGTERM to all workers gone", stop_time)]:
        samples: dict[str, list[float]] = {k: [] for k in launchers}
        for _ in range(a.repeat):
            for k, cmd in launchers.items():
                samples[k].append(fn(cmd, a.nproc))
        med = {k: statistics.median(v) for k, v in samples.items()}
        for k in ["relaunch", "python -m relaunch", *also]:
            ratio = med["torchrun"] / med[k]
            rows.append((f"{name}, {a.nproc} workers", k, med[k], med["torchrun"], ratio))
            print(
                f"{name:<32} {k:<18} {med[k] * 1000:8.1f} ms  torchrun "
                f"{med['torchrun'] * 1000:8.1f} ms  ratio {ratio:6.1f}x",
                flush=True,
            )
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "launch.json").write_text(json.dumps(rows, indent=2))
    print("\n| workload | relaunch | torchrun | ratio |\n|---|---|---|---|")
    for name, k, ours, theirs, ratio in rows:
        print(f"| {name}, {k} | {ours * 1000:.1f} ms | {theirs * 1000:.1f} ms | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
