"""The hang benchmark (issue 13): what a progress beat costs a training
loop, and how long a hang takes to be reported and the job restarted.

    .venv/bin/python bench/hang/run.py [--repeat 3] [--ranks 4] [--hang-timeout 5]

- beat cost: `bench/hang/beat_cost.py` under `relaunch run
  --nproc-per-node 1` times `relaunch.heartbeat(step)` and `run.log({1
  value}, step=)` (offline, into the spool; it beats too), median ns per
  call; the peer is the same script run plainly, where there is no beat
  file and a beat does nothing. Target: <= 1 us a beat.
- hang to report to restart: `python/tests/workers/hang_collective.py` on
  `--ranks` ranks (gloo, a spawn DataLoader each), rank 1 stuck at step 3
  of attempt 0 while the others wait in all_reduce, `--hang-timeout`
  seconds: from the moment rank 1 got stuck (it writes the time) to the
  hang report (`detected` in hang.json, once every rank's stacks are
  taken) and to the last rank of attempt 1 starting its loop again.
  Target: <= hang timeout + 5 s. Stacks by py-spy when it is in this
  Python's environment (the report says which).

Results go to stdout as a markdown table and to bench/out/hang.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import run_json, write_result  # noqa: E402

PY = sys.executable
BIN = str(Path(PY).parent)
RELAUNCH = [PY, "-m", "relaunch", "run"]
WORKER = ROOT / "python" / "tests" / "workers" / "hang_collective.py"


def beat_cost() -> dict:
    plain = run_json([PY, str(HERE / "beat_cost.py")])
    with tempfile.TemporaryDirectory() as logs:
        subprocess.run([*RELAUNCH, "--nproc-per-node", "1", "--log-dir", logs,
                        str(HERE / "beat_cost.py")], check=True, capture_output=True)  # fmt: skip
        stdout = next(Path(logs).glob("*/attempt_0/0/stdout.log")).read_text()
        launched = json.loads(stdout.strip().splitlines()[-1])
    assert launched["beats"] and not plain["beats"], (launched, plain)
    return {"relaunch": launched, "plain": plain}


def one_hang(ranks: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out, logs = Path(d) / "out", Path(d) / "logs"
        out.mkdir()
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        proc = subprocess.run(
            [*RELAUNCH, "--nproc-per-node", str(ranks), "--hang-timeout", str(timeout),
             "--max-restarts", "1", "--log-dir", str(logs), str(WORKER), str(out)],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"the hang job failed:\n{proc.stdout[-3000:]}")
        stuck = float((out / "stuck").read_text())
        report = json.loads(next(logs.glob("*/attempt_0/hang.json")).read_text())
        restarted = max(float((out / f"started.1.{r}").read_text()) for r in range(ranks))
        return {
            "to_report_s": report["detected"] - stuck,
            "to_restart_s": restarted - stuck,
            "first_rank": report["first_rank"],
            "stacks_by": sorted({r["stacks_by"] for r in report["ranks"]}),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--hang-timeout", type=float, default=5.0)
    a = p.parse_args()
    started = time.time()
    costs = [beat_cost() for _ in range(a.repeat)]
    hangs = [one_hang(a.ranks, a.hang_timeout) for _ in range(a.repeat)]

    def med(side: str, key: str) -> float:
        return statistics.median(c[side][key] for c in costs)

    beat, noop = med("relaunch", "heartbeat_ns"), med("plain", "heartbeat_ns")
    log, log_plain = med("relaunch", "log_ns"), med("plain", "log_ns")
    report = statistics.median(h["to_report_s"] for h in hangs)
    restart = statistics.median(h["to_restart_s"] for h in hangs)
    budget = a.hang_timeout + 5
    rows = [
        ("relaunch.heartbeat(step) under relaunch run", f"{beat:.0f} ns",
         "the same call with no beat file (a no-op)", f"{noop:.0f} ns",
         f"{noop / beat:.2f}x", "<= 1 us", beat <= 1000),
        ("run.log({1 value}, step=) under relaunch run (offline; beats)", f"{log:.0f} ns",
         "the same call with no beat file", f"{log_plain:.0f} ns",
         f"{log_plain / log:.2f}x", "", None),
        (f"hang to report, {a.ranks} ranks, --hang-timeout {a.hang_timeout:g}", f"{report:.2f} s",
         "-", "-", "-", "", None),
        (f"hang to restarted (every rank of attempt 1 in its loop), {a.ranks} ranks",
         f"{restart:.2f} s", "hang timeout + 5 s", f"{budget:.2f} s",
         f"{budget / restart:.2f}x", "<= timeout + 5 s", restart <= budget),
    ]  # fmt: skip
    print(f"# hang benchmark, {os.cpu_count()} CPUs, median of {a.repeat}; "
          f"stacks by {hangs[0]['stacks_by']}")  # fmt: skip
    print("| figure | relaunch | peer | peer's | ratio | target | met |")
    print("|---|---|---|---|---|---|---|")
    for name, ours, peer, theirs, ratio, target, met in rows:
        print(f"| {name} | {ours} | {peer} | {theirs} | {ratio} | {target} | "
              f"{'' if met is None else 'yes' if met else 'NOT met'} |")  # fmt: skip
    write_result("hang", {"started": started, "cpus": os.cpu_count(), "args": vars(a),
                          "beats": costs, "hangs": hangs, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
