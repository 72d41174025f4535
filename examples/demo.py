"""The demo: a DDP training job launched with `relaunch run`, logged to a
tracking server, preempted, and resumed where it stopped.

0. `relaunch server` starts on loopback with its data in DIR/server (the
   embedded default: SQLite and files, nothing to install).
1. `relaunch run --server URL --nproc-per-node 4 examples/train.py` trains on
   CPU (gloo), checkpointing every 10 steps; every rank logs its loss to the
   job's run, and the launcher logs the job's status, console lines and
   system metrics.
2. Once it is under way, the demo sends SIGTERM to the launcher, as SLURM
   or Kubernetes would: every rank agrees on one stop step, rank 0 saves it,
   and the launcher exits 75 ("preempted, requeue me"); the run shows
   `preempted`.
3. The same command runs again: the job resumes from that step and
   finishes; the launcher exits 0. The run, the same one, shows `finished`,
   two attempts, and one loss value per step.

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
import urllib.parse
import urllib.request
from pathlib import Path

from relaunch._subprocess import ServerProcess

TRAIN = Path(__file__).resolve().parent / "train.py"


def launch(args: argparse.Namespace, run_id: str, server: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "relaunch", "run", "--nproc-per-node", str(args.nproc),
        "--run-id", run_id, "--log-dir", str(args.dir / "logs"),
        "--server", server, "--project", "demo", "--tracking-dir", str(args.dir / "spool"),
        str(TRAIN), "--ckpt-dir", str(args.dir / "ckpt"), "--steps", str(args.steps),
        "--step-time", "0.03", "--out", str(args.dir / "result"),
    ]  # fmt: skip
    print(
        f"$ relaunch run --server {server} --nproc-per-node {args.nproc} examples/train.py ...",
        flush=True,
    )
    return subprocess.Popen(cmd)


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
    p.add_argument("--steps", type=int, default=300)
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
            f"demo OK: {args.nproc} workers trained to step {args.steps - 1}, preempted and "
            f"resumed from their checkpoint, logged as run {run_id}; checkpoints and logs in "
            f"{args.dir}.\nSee it again: relaunch server --data-dir {args.dir / 'server'} "
            f"--port 0, then relaunch runs show {run_id} --server URL (or relaunch logs, "
            "relaunch metrics)",
            flush=True,
        )
    return code


def demo(args: argparse.Namespace, run_id: str, server: str) -> int:
    print("== 1. launch", flush=True)
    job = launch(args, run_id, server)
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
    status = api(server, f"/runs/{run_id}")["status"]  # type: ignore[index]
    print(
        f"== every rank stopped at step {stopped_at}; launcher exit code {code}; "
        f"run {run_id} is {status}",
        flush=True,
    )
    if status != "preempted":
        print(f"demo FAILED: the run shows {status}, not preempted")
        return 1

    print("== 3. resume: the same command again", flush=True)
    job = launch(args, run_id, server)
    code = job.wait(600)
    final = [json.loads((args.dir / f"result.{r}").read_text()) for r in range(args.nproc)]
    if code != 0 or {f["step"] for f in final} != {args.steps - 1}:
        print(f"demo FAILED: resumed run exit code {code}, results {final}")
        return 1
    run = api(server, f"/runs/{run_id}")
    loss = api(server, f"/runs/{run_id}/series", key="loss", rank=0, buckets=100000)
    steps = [point["step"] for point in loss["points"]]  # type: ignore[index]
    if run["status"] != "finished" or run["attempts"] != 2 or steps != list(range(args.steps)):  # type: ignore[index]
        print(f"demo FAILED: the run on the server is {run}, loss steps {steps[:5]}...")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
