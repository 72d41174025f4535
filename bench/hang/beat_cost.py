"""Run by bench/hang/run.py under `relaunch run --nproc-per-node 1`, and
plainly (no beat file, so a beat does nothing):
the median cost of one `relaunch.heartbeat(step)` and of one `run.log` of
one value (which beats too, offline, into a spool in a temporary
directory), against the same call outside `relaunch run` (no beat file:
the beat is a no-op) and against an empty Python function call, all in
this process. Prints one JSON line."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import relaunch

N = 200_000
ROUNDS = 7


def per_call(fn, n: int = N) -> float:
    """Median over ROUNDS of the ns per call of `fn(i)`, n calls a round."""
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter_ns()
        for i in range(n):
            fn(i)
        rounds.append((time.perf_counter_ns() - start) / n)
    return statistics.median(rounds)


def nothing(_: int) -> None:
    pass


def main() -> None:
    out: dict = {
        "python": sys.version.split()[0],
        "beats": bool(os.environ.get("RELAUNCH_BEAT_FILE")),
    }
    out["empty_call_ns"] = per_call(nothing)
    out["heartbeat_ns"] = per_call(relaunch.heartbeat)
    with tempfile.TemporaryDirectory() as d:
        run = relaunch.init(project="bench", offline=True, dir=d)
        out["log_ns"] = per_call(lambda i: run.log({"loss": 0.5}, step=i), n=N // 4)
        run.finish()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
