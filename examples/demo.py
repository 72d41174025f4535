"""The demo: a DDP training job launched with `relaunch run`, logged to a
tracking server, preempted mid-epoch, and resumed exactly where it stopped.

0. `relaunch server` starts on loopback with its data in DIR/server (the
   embedded default: SQLite and files, nothing to install).
1. `relaunch run --server URL --nproc-per-node 4 examples/resume.py` trains
   on CPU (gloo) with `relaunch.InterruptibleSampler` and
   `relaunch.Checkpointer` (a checkpoint every 20 steps, shipped to the
   server); every rank logs its loss to the job's run, and the launcher logs
   the job's status, console lines and system metrics.
2. Mid-epoch, the demo sends SIGTERM to the launcher, as SLURM or Kubernetes
   would: every rank agrees on one stop step, the checkpoint of that step is
   committed on all ranks, and the launcher exits 75 ("preempted, requeue
   me"); the run shows `preempted`.
3. The same command runs again: the job resumes from that checkpoint, in
   the middle of the epoch, and finishes; the launcher exits 0. The run, the
   same one, shows `finished`, two attempts, and one loss value per step.

    python examples/demo.py [--nproc 4] [--epochs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import relaunch
from relaunch._subprocess import ServerProcess

RESUME = Path(__file__).resolve().parent / "resume.py"


def launch(args: argparse.Namespace, run_id: str, server: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "relaunch", "run", "--nproc-per-node", str(args.nproc),
        "--run-id", run_id, "--log-dir", str(args.dir / "logs"),
        "--server", server, "--project", "demo", "--tracking-dir", str(args.dir / "spool"),
        str(RESUME), "--ckpt-dir", str(args.dir / "ckpt"), "--epochs", str(args.epochs),
        "--samples", str(args.samples), "--step-time", "0.03",
        "--losses", str(args.dir / "losses.txt"),
    ]  # fmt: skip
    print(
        f"$ relaunch run --server {server} --nproc-per-node {args.nproc} examples/resume.py ...",
        flush=True,
    )
    return subprocess.Popen(cmd)


def logged_steps(args: argparse.Namespace) -> list[int]:
    path = args.dir / "losses.txt"
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()]


def api(server: str, path: str, **query: object) -> object:
    url = f"{server}/api/v1{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def relaunch_cli(*args: str) -> None:
    print(f"$ relaunch {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "relaunch", *args], check=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    args.dir = args.dir or Path(tempfile.mkdtemp(prefix="relaunch-demo-"))
    run_id = f"demo-{int(time.time())}"

    print(f"== 0. start the tracking server (data in {args.dir / 'server'})", flush=True)
    with ServerProcess(args.dir / "server") as server:
        code = demo(args, run_id, server.url)
        if code == 0:
            print(f"== the run on {server.url}", flush=True)
            relaunch_cli("runs", "show", run_id, "--server", server.url)
    if code == 0:
        print(
            f"demo OK: {args.nproc} workers trained {total_steps(args)} steps, preempted "
            f"mid-epoch and resumed from their checkpoint, logged as run {run_id}; "
            f"checkpoints and logs in "
            f"{args.dir}.\nSee it again: relaunch server --data-dir {args.dir / 'server'} "
            f"--port 8765, then open http://127.0.0.1:8765/runs/{run_id} in a browser (the "
            f"dashboard), or relaunch runs show {run_id} --server http://127.0.0.1:8765 (or "
            "relaunch logs, relaunch metrics)",
            flush=True,
        )
    return code


def total_steps(args: argparse.Namespace) -> int:
    """Steps of the whole job: batches of 8 of each rank's share, per epoch."""
    per_rank = math.ceil(args.samples / args.nproc)  # padded, as DistributedSampler does
    return args.epochs * math.ceil(per_rank / 8)


def demo(args: argparse.Namespace, run_id: str, server: str) -> int:
    print("== 1. launch", flush=True)
    job = launch(args, run_id, server)
    total = total_steps(args)
    deadline = time.monotonic() + 300
    # Mid-epoch, past a periodic checkpoint.
    while len(logged_steps(args)) < total // 2 + 5:
        if job.poll() is not None or time.monotonic() > deadline:
            print(f"demo FAILED: the job ended before it got under way ({job.returncode})")
            return 1
        time.sleep(0.1)

    print("== 2. preempt: SIGTERM to the launcher", flush=True)
    job.send_signal(signal.SIGTERM)
    code = job.wait(120)
    ckpt = relaunch.Checkpointer(args.dir / "ckpt").latest(verify="full")
    steps = logged_steps(args)
    if code != 75 or ckpt is None or ckpt.step != steps[-1]:
        print(f"demo FAILED: preemption exit code {code}, checkpoint {ckpt}, last step {steps[-1]}")
        return 1
    status = api(server, f"/runs/{run_id}")["status"]  # type: ignore[index]
    print(
        f"== every rank stopped at step {ckpt.step} and committed its checkpoint; launcher exit "
        f"code {code}; run {run_id} is {status}",
        flush=True,
    )
    if status != "preempted":
        print(f"demo FAILED: the run shows {status}, not preempted")
        return 1

    print("== 3. resume: the same command again", flush=True)
    job = launch(args, run_id, server)
    code = job.wait(600)
    steps = logged_steps(args)
    if code != 0 or steps != list(range(total)):
        print(f"demo FAILED: resumed run exit code {code}, steps {steps[:3]}..{steps[-3:]}")
        return 1
    run = api(server, f"/runs/{run_id}")
    loss = api(server, f"/runs/{run_id}/series", key="loss", rank=0, buckets=100000)
    logged = [point["step"] for point in loss["points"]]  # type: ignore[index]
    if run["status"] != "finished" or run["attempts"] != 2 or logged != list(range(total)):  # type: ignore[index]
        print(f"demo FAILED: the run on the server is {run}, loss steps {logged[:5]}...")
        return 1
    print(
        f"== resumed at step {ckpt.step + 1}, mid-epoch, and finished: every step once", flush=True
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
