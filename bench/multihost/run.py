"""A node cut off, to the survivors training again: an elastic job on three
hosts, relaunch against torchrun's c10d rendezvous.

    .venv/bin/python bench/multihost/run.py [--repeat 3] [--collective-timeout 30] [--keep-alive 5]

Needs root: each host is a network namespace on a bridge of its own
(`python/tests/netns.py`, the multi-host tests' helper), made anew for
every sample and deleted after it, every process in it killed.

Both sides run the same job: `--nnodes 2:3 --nproc-per-node 1
--rdzv-backend c10d --rdzv-endpoint H0:29400 --rdzv-conf
last_call_timeout=1 --max-restarts 3 --monitor-interval 0.2`, one launcher
per host, the multi-host tests' gloo DDP worker
(`python/tests/workers/multihost_train.py`, ~50 ms steps, a checkpoint
after each step, resumed by a new attempt) with a process-group timeout
of `--collective-timeout` seconds (the same on both sides). relaunch also
gets `keep_alive_timeout=--keep-alive` (its launchers' heartbeats; torchrun
has no equivalent that ends a running attempt) and `--shutdown-timeout 3`.
Peer: `python -m torch.distributed.run` of the torch in this environment.

A sample: the three hosts train until each has completed 10 steps in a
world of 3; then host 2's link goes down (its bridge port, so nothing is
reset: a cable pulled). Measured: from the cut (`time.time()` just before
the `ip link set down`) to the first step completed in a world of 2 by a
survivor (`time.time()` the worker writes when the step is done, on the
same clock). Also reported: when the survivors' launchers said the node
was lost (relaunch: its "sent no heartbeat" line; torchrun: the worker
failure it reports) is not timed; the time splits into detection and
restart in the logs kept with `--keep`. The sides alternate; medians.

Results: a markdown table on stdout and bench/out/multihost.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "python" / "tests"))

import netns  # noqa: E402
from common import compare, write_result  # noqa: E402

WORKER = ROOT / "python" / "tests" / "workers" / "multihost_train.py"
PORT = 29400
WARM_STEPS = 10


class Failed(Exception):
    """A sample did not go as it must: the benchmark exits 1 saying why."""


def launcher_command(side: str, endpoint: str, keep_alive: float, host: netns.Host) -> list[str]:
    common = [
        "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "bench", "--max-restarts", "3",
        "--monitor-interval", "0.2",
    ]  # fmt: skip
    if side == "relaunch":
        conf = f"last_call_timeout=1,keep_alive_timeout={keep_alive}"
        return [sys.executable, "-m", "relaunch", "run", *common, "--rdzv-conf", conf,
                "--shutdown-timeout", "3"]  # fmt: skip
    # torchrun guesses whether it hosts the store, and the address its
    # workers meet at, from the machine's hostname, which every namespace
    # shares (and which resolves to loopback): tell it both, as a user
    # whose hosts' names do not resolve would.
    conf = f"last_call_timeout=1,is_host={'true' if host.index == 0 else 'false'}"
    return [sys.executable, "-m", "torch.distributed.run", *common, "--rdzv-conf", conf,
            "--local-addr", host.addr]  # fmt: skip


class Steps:
    """The step records the workers appended under ``out``, read as they grow."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seen: list[dict] = []
        self.offsets: dict[Path, int] = {}

    def __call__(self) -> list[dict]:
        for path in self.out.glob("steps.*.jsonl"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            whole = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(whole)
            self.seen += [json.loads(line) for line in whole.splitlines()]
        return self.seen


def wait_until(condition, timeout: float, what: str, dir: Path):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what} (logs in {dir})")
        time.sleep(0.05)


def sample(
    side: str, dir: Path, collective_timeout: float, keep_alive: float, patience: float
) -> float:
    """One cut: seconds from the cut to the survivors' first step in a world
    of 2; infinity when they did not train again within ``patience``
    seconds, or every launcher exited first."""
    out = dir / "out"
    out.mkdir(parents=True)
    records = Steps(out)
    hosts = netns.Hosts(3)
    try:
        endpoint = f"{hosts[0].addr}:{PORT}"
        launchers: list[subprocess.Popen] = []
        train = [str(WORKER), str(out), "--steps", "100000", "--step-time", "0.05",
                 "--timeout", str(collective_timeout)]  # fmt: skip
        for h in hosts:
            env = {
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("RELAUNCH_", "TORCHELASTIC_", "PET_", "MASTER_"))
            }
            env.update(MH_HOST=h.name, GLOO_SOCKET_IFNAME=netns.IFACE, OMP_NUM_THREADS="1")
            with (dir / f"{h.name}.log").open("w") as log:
                cmd = launcher_command(side, endpoint, keep_alive, h)
                proc = h.popen(
                    [*cmd, *train],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
                launchers.append(proc)

        def warm() -> bool:
            rs = records()
            return all(
                sum(r["host"] == h.name and r["world"] == 3 for r in rs) >= WARM_STEPS
                for h in hosts
            )

        wait_until(warm, 180, "three hosts training", dir)
        cut = time.time()
        hosts[2].cut()

        def again() -> float | None:
            # Both survivors completed a step in a world of 2 (so did the
            # whole world: a step ends with an all-reduce); the first did when?
            rs = [r for r in records() if r["world"] == 2 and r["t"] > cut]
            if {r["host"] for r in rs} == {"h0", "h1"}:
                return min(r["t"] for r in rs)
            if all(p.poll() is not None for p in launchers[:2]):
                return math.inf  # the survivors' launchers gave up
            return None

        try:
            first = wait_until(again, patience, "the survivors to train again", dir)
        except Failed:
            first = math.inf
        if first == math.inf:
            return math.inf
        trained = {r["host"] for r in records() if r["world"] == 2}
        if trained != {"h0", "h1"}:
            raise Failed(f"{side}: steps in a world of 2 on {sorted(trained)}, not h0 and h1")
        return first - cut
    finally:
        hosts.close()


def seconds(s: float, patience: float) -> str:
    return f"{s:.2f} s" if s != math.inf else f"did not train again (waited {patience:.0f} s)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--collective-timeout", type=float, default=30.0)
    p.add_argument("--keep-alive", type=float, default=5.0)
    p.add_argument(
        "--patience",
        type=float,
        default=300.0,
        help="seconds after the cut before a sample counts as never training again",
    )
    p.add_argument("--keep", action="store_true", help="keep the logs")
    a = p.parse_args()
    try:
        netns.check_available()
    except netns.Unavailable as e:
        print(f"bench/multihost: {e}", file=sys.stderr)
        return 1
    dir = Path(tempfile.mkdtemp(prefix="relaunch-bench-multihost-"))
    times: dict[str, list[float]] = {"relaunch": [], "torchrun": []}
    try:
        for i in range(a.repeat):
            order = ["relaunch", "torchrun"] if i % 2 == 0 else ["torchrun", "relaunch"]
            for side in order:
                s = sample(side, dir / f"{side}-{i}", a.collective_timeout, a.keep_alive,
                           a.patience)  # fmt: skip
                times[side].append(s)
                print(f"  {side} #{i}: {seconds(s, a.patience)}", flush=True)
    except Failed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    row = compare(
        "node cut off to survivors training again (3 hosts, --nnodes 2:3)",
        times["relaunch"],
        times["torchrun"],
        "torchrun",
        2.0,
        collective_timeout_s=a.collective_timeout,
        keep_alive_timeout_s=a.keep_alive,
        patience_s=a.patience,
    )
    path = write_result("multihost", row)
    print(
        "\n| workload | relaunch | torchrun | ratio |\n|---|---|---|---|\n"
        f"| {row['name']} | {seconds(row['relaunch'], a.patience)} | "
        f"{seconds(row['peer'], a.patience)} | {row['ratio']:.2f}x |\n\nresults in {path}"
    )
    if a.keep:
        print(f"logs in {dir}")
    else:
        shutil.rmtree(dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
