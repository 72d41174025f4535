"""The demo: a DDP training job launched with `relaunch run`, preempted, and
resumed where it stopped.

1. `relaunch run --nproc-per-node 4 examples/train.py` trains on CPU (gloo),
   checkpointing every 10 steps.
2. Once it is under way, the demo sends SIGTERM to the launcher, as SLURM
   or Kubernetes would: every rank agrees on one stop step, rank 0 saves it,
   and the launcher exits 75 ("preempted, requeue me").
3. The same command runs again: the job resumes from that step and
   finishes; the launcher exits 0.

    python examples/demo.py [--nproc 4] [--steps 300] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = Path(__file__).resolve().parent / "train.py"


def launch(args: argparse.Namespace, run_id: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "relaunch", "run", "--nproc-per-node", str(args.nproc),
        "--run-id", run_id, "--log-dir", str(args.dir / "logs"),
        str(TRAIN), "--ckpt-dir", str(args.dir / "ckpt"), "--steps", str(args.steps),
        "--step-time", "0.03", "--out", str(args.dir / "result"),
    ]  # fmt: skip
    print(f"$ relaunch run --nproc-per-node {args.nproc} examples/train.py ...", flush=True)
    return subprocess.Popen(cmd)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    args.dir = args.dir or Path(tempfile.mkdtemp(prefix="relaunch-demo-"))
    run_id = f"demo-{int(time.time())}"

    print("== 1. launch", flush=True)
    job = launch(args, run_id)
    first_ckpt = args.dir / "ckpt" / "step_49.pt"
    deadline = time.monotonic() + 300
    while not first_ckpt.exists():
        if job.poll() is not None or time.monotonic() > deadline:
            print(f"demo FAILED: the job ended before its first checkpoints ({job.returncode})")
            return 1
        time.sleep(0.1)

    print("== 2. preempt: SIGTERM to the launcher", flush=True)
    job.send_signal(signal.SIGTERM)
    code = job.wait(120)
    stops = [json.loads((args.dir / f"result.{r}").read_text()) for r in range(args.nproc)]
    stop_steps = {s["step"] for s in stops}
    if code != 75 or len(stop_steps) != 1 or not all(s["preempted"] for s in stops):
        print(f"demo FAILED: preemption exit code {code}, stop steps {stop_steps}")
        return 1
    stopped_at = stop_steps.pop()
    print(f"== every rank stopped at step {stopped_at}; launcher exit code {code}", flush=True)

    print("== 3. resume: the same command again", flush=True)
    job = launch(args, run_id)
    code = job.wait(600)
    final = [json.loads((args.dir / f"result.{r}").read_text()) for r in range(args.nproc)]
    if code != 0 or {f["step"] for f in final} != {args.steps - 1}:
        print(f"demo FAILED: resumed run exit code {code}, results {final}")
        return 1
    print(
        f"demo OK: {args.nproc} workers trained to step {args.steps - 1}, preempted at step "
        f"{stopped_at} and resumed from it; checkpoints and logs in {args.dir}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
