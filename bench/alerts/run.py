"""The alert flood: how long a run's `alert()` calls take to be taken by a
server whose webhook is down (each one written to the alert outbox).

    .venv/bin/python bench/alerts/run.py [--alerts 10000] [--repeat 3] [--baseline BINARY]

A `relaunch server` (the `relaunch` next to this Python unless `--binary`
names another; default `--durability fsync`) with one webhook that refuses
connections and one rule; one run calls `run.alert()` `--alerts` times,
then `flush()` waits until the server has acknowledged them all, which it
does once each is in the outbox on disk. The figure is the seconds
`flush()` took, median of `--repeat`. `--baseline BINARY` times another
build in the same alternating runs (the ratio is its time over this one's).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import write_result

import relaunch

BIN = Path(sys.executable).parent


def flood(binary: str, alerts: int) -> float:
    """Seconds from the first `flush()` after `alerts` alerts to its return."""
    work = Path(tempfile.mkdtemp(prefix="relaunch-bench-alerts-"))
    server = subprocess.Popen(
        [binary, "server", "--data-dir", str(work / "data"), "--port", "0",
         "--webhook", "http://127.0.0.1:9/down", "--alert", "loss > 1e300"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = None
        assert server.stderr is not None
        for line in server.stderr:
            found = re.search(r"http://127\.0\.0\.1:\d+", line)
            if found:
                url = found.group(0)
                break
        if url is None:
            raise RuntimeError(f"{binary} server did not start")
        run = relaunch.init("bench-alerts", id="flood", server=url, dir=work / "spool")
        for i in range(alerts):
            run.alert(f"alert {i}", "the webhook is down")
        started = time.perf_counter()
        run.flush(timeout=3600)
        took = time.perf_counter() - started
        run.finish()
        return took
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alerts", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--binary", default=str(BIN / "relaunch"))
    p.add_argument("--baseline", default=None, metavar="BINARY")
    a = p.parse_args()
    builds = {"relaunch": a.binary, **({"baseline": a.baseline} if a.baseline else {})}
    samples: dict[str, list[float]] = {k: [] for k in builds}
    for _ in range(a.repeat):
        for name, binary in builds.items():
            samples[name].append(flood(binary, a.alerts))
    medians = {k: statistics.median(v) for k, v in samples.items()}
    for name, took in medians.items():
        print(f"{a.alerts} alerts taken, {name}: {took:.2f} s (median of {a.repeat})", flush=True)
    if a.baseline:
        print(f"ratio (baseline / relaunch): {medians['baseline'] / medians['relaunch']:.1f}x")
    write_result("alerts", {"alerts": a.alerts, "samples": samples, "medians": medians})


if __name__ == "__main__":
    main()
