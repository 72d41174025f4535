"""The preemption benchmarks: goodput under repeated preemption, and restart
latency after a crash, each an end-to-end proof that fails loudly.

    .venv/bin/python bench/preempt/run.py [--only goodput|crash|memory|nodes] [--repeat 2] \
        [--seed 0]

Both run `bench/preempt/train.py` (2 ranks, gloo, CPU, a DataLoader with
workers over 1001 synthetic samples, `relaunch.InterruptibleSampler`,
SGD with momentum, `relaunch.Checkpointer`, ~30 ms steps) under the
`relaunch` script of this Python environment, and read the timestamps
each rank writes (`time.time()`: process start, first step done, stop step
done, exit).

**Goodput under preemption.** A `relaunch server` on a free loopback port
with a temporary data dir. The job (3 epochs, 189 steps) runs once
uninterrupted (`relaunch run --nproc-per-node 2 --server URL --run-id
ref-...`), then under another run id with a SIGTERM to the launcher at 5
random mid-epoch moments (a random step of each fifth of the job, at a
random point within that step), relaunched with the same run id after each
exit until it finishes. Checked (exit 1 with the reason otherwise): every
preempted launch exits 75 and the last 0; every launch starts at the step
after the previous one's stop step, on every rank (0 steps lost); the final
model and optimizer tensors are `torch.equal` to the uninterrupted run's;
on the server (`GET /api/v1/runs/ID/series`, read per attempt) every
step's loss of each rank is stored exactly once (the raw point counts of
all attempts add up to the number of steps, and no step is in two
attempts) and equals the uninterrupted run's loss at that step. Reported:
wall time of both, the overhead and its parts per preemption: start-up
(launcher start to first step done), stop (SIGTERM to launcher exit;
split into the steps until the agreed stop step, which are useful work,
and stop step to exit: the checkpoint, its upload, the shutdown), restart
(launcher exit to first step done of the next launch).

**Restart latency after a crash.** The job (1 epoch) under `relaunch run
--max-restarts 1`; at a random moment after step 25 the benchmark sends
SIGKILL to rank 1's process (not the launcher). Measured: the last step
done before the SIGKILL to the first step done after the restart, against
the target `backoff (1 s) + the job's own start-up (rank 0's process start
to its first step done, on the first attempt) + 0.5 s`; ratio = measured /
target (at most 1 meets it). With DataLoader workers (`--num-workers 2`)
and without (`0`), `--repeat` times each, medians. Checked: the launcher
restarts once and exits 0, the second attempt resumes after the last
checkpoint and the job finishes.

**A killed rank, from disk or from memory** (`--only memory`). The job (2
epochs, 126 steps) with disk checkpoints every 50 steps, four ways:
torchrun with rank 0 `torch.save`-ing every 50 steps (`--plain-save`, no
relaunch in the job), `relaunch run` with the Checkpointer on disk only,
and `relaunch run` with `memory_every=1` as well, with cold restarts
(`--warm-restarts off`) and warm ones (the default: the kill comes once
the warm interpreter is ready); each SIGKILLed in rank 1 after the same
random steps (`--repeat` of them, past step 55). Measured: steps re-run,
the gap from the last step done before the kill to the first step done
after it (and, for the restarted rank 0, where its start-up went), and the
time until the job is back past the newest step done before the kill (the
gap plus the re-run steps). Checked: memory_every=1 re-runs at most 1
step, and its final state is bitwise the disk-only run's.

**A lost node** (`--only nodes`). The same job on three nodes (three
launchers on this machine, `--nnodes 2:3`, one rank each, each with its
own memory tier; `keep_alive_timeout=3`, so that the nodes left find the
lost one in seconds rather than the default 30 s; `--max-restarts 3`: the
loss of a node sometimes counts as two restarts, one for the workers that
did not stop and one for the node), disk checkpoints every
50 steps, without and with
`memory_every=1`; the last launcher (not the store's) is SIGKILLed with
its worker and its memory tier after the same random steps (`--repeat` of
them). Measured: steps re-run by the two nodes left and the gap from the
last step before the kill to their first step after. Checked: with memory
snapshots at most 1 step is re-run (the lost node's part comes from its
replica on the next node).

Results go to stdout (markdown rows) and bench/out/preempt.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import torch

from relaunch._subprocess import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import compare, write_result  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "train.py"
RELAUNCH = str(Path(sys.executable).parent / "relaunch")
NPROC = 2
SAMPLES = 1001
BATCH = 8
STEP_TIME = 0.03
EPOCHS = 3
PREEMPTIONS = 5
STEPS_PER_EPOCH = math.ceil(math.ceil(SAMPLES / NPROC) / BATCH)
BACKOFF = 1.0  # the launcher's backoff before its first restart
SLACK = 0.5


class Failed(Exception):
    """A correctness check failed: the benchmark exits 1 with this message."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise Failed(message)


class Job:
    """One `relaunch run` of train.py, its log in DIR/logs/NAME.log."""

    def __init__(
        self,
        dir: Path,
        name: str,
        launcher: list[str],
        train: list[str],
        torchrun: bool = False,
    ) -> None:
        (dir / "logs").mkdir(parents=True, exist_ok=True)
        self.log = dir / "logs" / f"{name}.log"
        if torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            cmd += ["--nproc-per-node", str(NPROC)]
        else:
            cmd = [RELAUNCH, "run", "--nproc-per-node", str(NPROC), "--log-dir", str(dir / "logs")]
        cmd += [*launcher, str(TRAIN), *train]
        self.command = cmd
        with self.log.open("w") as out:
            self.started = time.time()
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=dir)
        self.exited: float | None = None

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failed(f"launcher did not exit within {timeout:.0f} s\n{self.tail()}") from None
        self.exited = time.time()
        return code

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-n:]
        return f"--- {self.log} (last {len(lines)} lines) ---\n" + "\n".join(lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def steps_done(timing: Path, rank: int) -> list[tuple[int, int, int, float]]:
    """(launch, attempt, step, time) of every step `rank` has done so far."""
    path = timing / f"steps.rank{rank}"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            out.append((int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
    return out


def wait_for_step(
    job: Job, timing: Path, rank: int, launch: int, attempt: int, step: int, patience: float = 300
) -> int:
    """Waits until `rank` has done a step >= `step` in that launch and attempt,
    and at least 3 steps of it; returns the step it is at."""
    deadline = time.monotonic() + patience
    while True:
        mine = [s for (lc, at, s, _) in steps_done(timing, rank) if (lc, at) == (launch, attempt)]
        if mine and mine[-1] >= step and len(mine) >= 3:
            return mine[-1]
        if job.proc.poll() is not None:
            raise Failed(
                f"the job ended before step {step} (exit {job.proc.returncode})\n{job.tail()}"
            )
        if time.monotonic() > deadline:
            raise Failed(f"no step {step} within {patience} s\n{job.tail()}")
        time.sleep(0.005)


def read_timing(timing: Path, launch: int, attempt: int, rank: int) -> dict[str, Any]:
    path = timing / f"launch{launch}.attempt{attempt}.rank{rank}.json"
    check(path.exists(), f"{path} is missing: rank {rank} of launch {launch} never started")
    return json.loads(path.read_text())


def api(server: str, path: str, **query: object) -> Any:
    url = f"{server}/api/v1{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def stored_losses(server: str, run_id: str, rank: int) -> tuple[dict[int, float], list[str]]:
    """Each step's loss of `rank` as stored, read attempt by attempt, and the
    problems found: a step stored in two attempts, or more points stored than
    steps (a duplicate within an attempt, which a plain read folds away)."""
    attempts = api(server, f"/runs/{run_id}")["attempts"]
    losses: dict[int, float] = {}
    where: dict[int, int] = {}
    problems = []
    for attempt in range(attempts):
        q = dict(key="loss", rank=rank, attempt=attempt)
        series = api(server, f"/runs/{run_id}/series", **q, buckets=100000)
        check(not series["downsampled"], f"series of attempt {attempt} came back downsampled")
        # With one bucket, `total` counts the points stored before folding
        # equal steps into one.
        raw = api(server, f"/runs/{run_id}/series", **q, buckets=1)["total"]
        if raw != len(series["points"]):
            problems.append(
                f"attempt {attempt}: {raw} points stored for {len(series['points'])} steps"
            )
        for point in series["points"]:
            step = point["step"]
            if step in losses:
                problems.append(f"step {step} stored by attempts {where[step]} and {attempt}")
            losses[step] = float(point["value"])
            where[step] = attempt
    return losses, problems


def equal_state(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two nested state dicts differ (tensors compared with torch.equal)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return [] if ok else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path} keys"]
        return [d for k in a for d in equal_state(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{path} length"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in equal_state(x, y, f"{path}/{i}")]
    return [] if a == b else [path]


# --- goodput under preemption ----------------------------------------------------------


def stop_targets(rng: random.Random, total: int) -> list[int]:
    """One random mid-epoch step in each fifth of the job (the agreed stop step
    comes a few steps later and must stay in the same epoch)."""
    lo, hi = 8, total - 20
    width = (hi - lo) / PREEMPTIONS
    out = []
    for k in range(PREEMPTIONS):
        a, b = int(lo + k * width), int(lo + (k + 1) * width)
        mid = [s for s in range(a, b) if 3 <= s % STEPS_PER_EPOCH <= STEPS_PER_EPOCH - 18]
        out.append(rng.choice(mid or list(range(a, b))))
    return out


def goodput(dir: Path, seed: int) -> dict[str, Any]:
    total = EPOCHS * STEPS_PER_EPOCH
    rng = random.Random(seed)
    stamp = f"{int(time.time())}-{seed}"
    train = ["--epochs", str(EPOCHS), "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    train += ["--step-time", str(STEP_TIME), "--num-workers", "2"]
    with ServerProcess(dir / "server") as server:
        url = server.url

        def launcher(run_id: str) -> list[str]:
            return ["--server", url, "--run-id", run_id, "--project", "bench-preempt",
                    "--tracking-dir", str(dir / "spool")]  # fmt: skip

        # The uninterrupted run.
        ref_id, ref = f"ref-{stamp}", dir / "ref"
        args = [*train, "--ckpt-dir", str(ref / "ckpt"), "--timing", str(ref / "timing")]
        job = Job(dir, "ref", launcher(ref_id), [*args, "--final", str(ref / "final.pt")])
        command = job.command
        code = job.wait()
        check(code == 0, f"the uninterrupted run exited {code}\n{job.tail()}")
        ref_wall = job.exited - job.started  # type: ignore[operator]
        ref_start = read_timing(ref / "timing", 0, 0, 0)["first_step_done"] - job.started

        # The preempted run: SIGTERM at 5 random mid-epoch moments, relaunched each time.
        pre_id, pre = f"pre-{stamp}", dir / "pre"
        args = [*train, "--ckpt-dir", str(pre / "ckpt"), "--timing", str(pre / "timing")]
        launches = []
        for launch, target in enumerate([*stop_targets(rng, total), None]):
            extra = ["--launch", str(launch), "--final", str(pre / "final.pt")]
            job = Job(dir, f"pre{launch}", launcher(pre_id), [*args, *extra])
            info: dict[str, Any] = {"launch": launch, "started": job.started, "target": target}
            if target is not None:
                info["signalled_at_step"] = wait_for_step(job, pre / "timing", 0, launch, 0, target)
                time.sleep(rng.uniform(0, STEP_TIME))  # a random moment within the step
                info["sigterm"] = time.time()
                job.proc.send_signal(signal.SIGTERM)
            code = job.wait()
            info["exited"], info["code"] = job.exited, code
            want = 0 if target is None else 75
            check(code == want, f"launch {launch} exited {code}, not {want}\n{job.tail()}")
            for rank in range(NPROC):
                info[f"rank{rank}"] = read_timing(pre / "timing", launch, 0, rank)
            launches.append(info)
            print(
                f"  launch {launch}: steps {info['rank0'].get('start_step')}.."
                f"{info['rank0'].get('stop_step')}, exit {code}",
                flush=True,
            )

        # 0 steps lost: each launch starts right after the previous one's stop step.
        for rank in range(NPROC):
            stops = [info[f"rank{rank}"]["stop_step"] for info in launches]
            starts = [info[f"rank{rank}"]["start_step"] for info in launches]
            check(starts[0] == 0, f"rank {rank}: the first launch started at step {starts[0]}")
            check(stops[-1] == total - 1, f"rank {rank}: the job ended at step {stops[-1]}")
            for k in range(1, len(launches)):
                check(
                    starts[k] == stops[k - 1] + 1,
                    f"rank {rank}: launch {k} started at step {starts[k]} after launch "
                    f"{k - 1} stopped at step {stops[k - 1]}: "
                    f"{starts[k] - stops[k - 1] - 1} steps lost",
                )
        for info in launches:
            check(
                info["rank0"]["stop_step"] == info["rank1"]["stop_step"],
                f"launch {info['launch']}: the ranks stopped at different steps "
                f"({info['rank0']['stop_step']}, {info['rank1']['stop_step']})",
            )

        # The final state, bitwise.
        ours = torch.load(pre / "final.pt", weights_only=True)
        theirs = torch.load(ref / "final.pt", weights_only=True)
        diff = equal_state(ours, theirs)
        check(not diff, f"final state differs from the uninterrupted run's at {diff[:5]}")

        # Every step's loss stored once, equal to the uninterrupted run's.
        run = api(url, f"/runs/{pre_id}")
        check(run["status"] == "finished", f"run {pre_id} is {run['status']}, not finished")
        stored = 0
        for rank in range(NPROC):
            want, problems = stored_losses(url, ref_id, rank)
            check(not problems, f"uninterrupted run, rank {rank}: {problems[:5]}")
            check(sorted(want) == list(range(total)), f"uninterrupted run: rank {rank} steps")
            got, problems = stored_losses(url, pre_id, rank)
            check(not problems, f"preempted run, rank {rank}: {problems[:5]}")
            missing = sorted(set(range(total)) - set(got))
            check(not missing, f"preempted run, rank {rank}: no loss stored for steps {missing}")
            wrong = [s for s in range(total) if got[s] != want[s]]
            check(
                not wrong,
                f"preempted run, rank {rank}: loss differs from the uninterrupted run's at "
                f"steps {wrong[:10]} (e.g. {got[wrong[0]] if wrong else ''} vs "
                f"{want[wrong[0]] if wrong else ''})",
            )
            stored += len(got)
        attempts = run["attempts"]
        # What the tracker itself says of both runs (GET /runs/ID/goodput).
        tracked = {name: api(url, f"/runs/{rid}/goodput") for name, rid in
                   (("uninterrupted", ref_id), ("preempted", pre_id))}  # fmt: skip
        for name, g in tracked.items():
            parts = sum(g[k] for k in ("productive_s", "startup_s", "rerun_s", "stop_s",
                                        "restart_s"))  # fmt: skip
            check(abs(parts - g["wall_s"]) < 0.01, f"{name}: goodput parts {parts} != wall")
        check(tracked["preempted"]["steps_re_run"] == 0, "the tracker counts re-run steps")

    # Timings.
    pre_wall = launches[-1]["exited"] - launches[0]["started"]
    startup = [i["rank0"]["first_step_done"] - i["started"] for i in launches]
    preempted = launches[:-1]
    stop = [i["exited"] - i["sigterm"] for i in preempted]
    stop_steps = [
        max(i[f"rank{r}"]["stop_saved"] for r in range(NPROC)) - i["sigterm"] for i in preempted
    ]
    stop_exit = [i["exited"] - max(i[f"rank{r}"]["stop_saved"] for r in range(NPROC))
                 for i in preempted]  # fmt: skip
    # Of that: the worker's own shutdown (checkpoint close, tracking finish,
    # process group destroyed) and the rest (interpreter teardown, launcher).
    stop_worker = [max(i[f"rank{r}"]["exit"] - i[f"rank{r}"]["stop_saved"] for r in range(NPROC))
                   for i in preempted]  # fmt: skip
    stop_teardown = [i["exited"] - max(i[f"rank{r}"]["exit"] for r in range(NPROC))
                     for i in preempted]  # fmt: skip
    restart = [n["rank0"]["first_step_done"] - p["exited"] for p, n in itertools.pairwise(launches)]
    lost = [s + r for s, r in zip(stop_exit, restart, strict=True)]
    positions = [i["rank0"]["stop_step"] % STEPS_PER_EPOCH for i in preempted]
    result = {
        "command": " ".join(command),
        "steps": total,
        "steps_per_epoch": STEPS_PER_EPOCH,
        "preemptions": PREEMPTIONS,
        "stop_steps": [i["rank0"]["stop_step"] for i in preempted],
        "stop_positions_in_epoch": positions,
        "steps_lost": 0,
        "losses_checked": stored,
        "attempts": attempts,
        "wall_uninterrupted_s": ref_wall,
        "wall_preempted_s": pre_wall,
        "overhead_s": pre_wall - ref_wall,
        "overhead_per_preemption_s": (pre_wall - ref_wall) / PREEMPTIONS,
        "goodput": ref_wall / pre_wall,
        "startup_uninterrupted_s": ref_start,
        "startup_s": startup,
        "stop_s": stop,
        "stop_steps_to_agreed_s": stop_steps,
        "stop_agreed_to_exit_s": stop_exit,
        "stop_agreed_to_worker_exit_call_s": stop_worker,
        "stop_worker_exit_call_to_launcher_exit_s": stop_teardown,
        "restart_s": restart,
        "lost_per_preemption_s": lost,
        "launches": launches,
        "tracker_goodput": tracked,
    }
    return result


# --- restart latency after a crash -------------------------------------------------------


def crash_once(dir: Path, workers: int, rng: random.Random) -> dict[str, Any]:
    timing = dir / "timing"
    train = ["--epochs", "1", "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    train += ["--step-time", str(STEP_TIME), "--num-workers", str(workers)]
    train += ["--ckpt-dir", str(dir / "ckpt"), "--timing", str(timing)]
    job = Job(dir, "crash", ["--max-restarts", "1", "--run-id", f"crash-{dir.name}"], train)
    try:
        wait_for_step(job, timing, 1, 0, 0, 25)
        time.sleep(rng.uniform(0, STEP_TIME))
        victim = read_timing(timing, 0, 0, 1)["pid"]
        killed = time.time()
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        code = job.wait()
    finally:
        job.kill()
    check(code == 0, f"the crashed job exited {code}, not 0 after one restart\n{job.tail()}")
    first = read_timing(timing, 0, 0, 0)
    second = read_timing(timing, 0, 1, 0)
    before = [t for r in range(NPROC) for (_, at, _, t) in steps_done(timing, r)
              if at == 0 and t <= killed]  # fmt: skip
    last_before = max(before)
    startup = first["first_step_done"] - first["process_start"]
    latency = second["first_step_done"] - last_before
    check(second.get("finished") is True, f"the restarted attempt did not finish\n{job.tail()}")
    check(
        second["start_step"] % 20 == 1 or second["start_step"] == 0,
        f"the restarted attempt started at step {second['start_step']}, not after a checkpoint",
    )
    return {
        "command": " ".join(job.command),
        "latency_s": latency,
        "target_s": BACKOFF + startup + SLACK,
        "startup_first_attempt_s": startup,
        "kill_after_last_step_s": killed - last_before,
        "kill_to_restarted_process_s": second["process_start"] - killed,
        "startup_second_attempt_s": second["first_step_done"] - second["process_start"],
        "resumed_at_step": second["start_step"],
    }


def crash(dir: Path, repeat: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for workers in (2, 0):
        samples = []
        for i in range(repeat):
            sample = crash_once(dir / f"crash-w{workers}-{i}", workers, rng)
            print(
                f"  num_workers={workers}: {sample['latency_s']:.2f} s "
                f"(target {sample['target_s']:.2f} s; kill to restarted process "
                f"{sample['kill_to_restarted_process_s']:.2f} s)",
                flush=True,
            )
            samples.append(sample)
        row = compare(
            f"crash to first step after the restart, num_workers={workers}",
            [s["latency_s"] for s in samples],
            [s["target_s"] for s in samples],
            "target",
            1.0,
            ours_over_theirs=True,
            command=samples[0]["command"],
            runs=samples,
        )
        for part in ("startup_first_attempt_s", "kill_to_restarted_process_s",
                     "startup_second_attempt_s"):  # fmt: skip
            row[part] = statistics.median(s[part] for s in samples)
        rows.append(row)
    return rows


MEMORY_MODES = (
    "torchrun + torch.save",
    "relaunch, disk only",
    "relaunch, memory_every=1, cold restart",
    "relaunch, memory_every=1",
)
DISK_EVERY = 50


def memory_crash_once(dir: Path, mode: str, kill_after: int, rng: random.Random) -> dict[str, Any]:
    """One SIGKILL of rank 1 after step `kill_after`, with disk checkpoints
    every 50 steps and, in the last mode, a memory snapshot every step."""
    timing = dir / "timing"
    train = ["--epochs", "2", "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    train += ["--step-time", str(STEP_TIME), "--num-workers", "2", "--ckpt-every", str(DISK_EVERY)]
    train += ["--ckpt-dir", str(dir / "ckpt"), "--timing", str(timing)]
    train += ["--final", str(dir / "final.pt")]
    torchrun = mode.startswith("torchrun")
    if torchrun:
        train.append("--plain-save")
    if "memory" in mode:
        train += ["--memory-every", "1"]
    # torchrun's restarted gloo mesh sometimes fails to connect (refused):
    # it gets restarts to spare, and the gap runs to the attempt that trained.
    launcher = ["--max-restarts", "3"] if torchrun else ["--max-restarts", "1"]
    launcher += [] if torchrun else ["--run-id", f"mem-{dir.name}"]
    # relaunch restarts warm unless told not to.
    launcher += ["--warm-restarts", "off"] if mode.endswith("cold restart") else []
    job = Job(dir, "crash", launcher, train, torchrun=torchrun)
    try:
        # The attempt that trains: torchrun's first gloo mesh sometimes
        # fails to connect, and it restarts before any step.
        first = 0
        deadline = time.monotonic() + 300
        while True:
            try:
                wait_for_step(job, timing, 1, 0, first, kill_after, patience=5)
                break
            except Failed:
                if job.proc.poll() is not None:
                    raise
                if (timing / f"launch0.attempt{first + 1}.rank1.json").exists():
                    first += 1
                check(time.monotonic() < deadline, f"{mode}: no step {kill_after}\n{job.tail()}")
        if not torchrun and not mode.endswith("cold restart"):
            # The kill lands once the warm interpreter is ready, as it
            # would in a job that has run for more than a few seconds.
            zygote = next(dir.glob("logs/*/zygote.log"), None)
            deadline = time.monotonic() + 120
            while not (zygote and " ready in " in zygote.read_text()):
                check(time.monotonic() < deadline, f"{mode}: no warm interpreter ready")
                time.sleep(0.05)
                zygote = next(dir.glob("logs/*/zygote.log"), None)
        time.sleep(rng.uniform(0, STEP_TIME))
        victim = read_timing(timing, 0, first, 1)["pid"]
        killed = time.time()
        subprocess.run(["kill", "-KILL", str(victim)], check=True)
        code = job.wait()
    finally:
        job.kill()
    check(code == 0, f"{mode}: the job exited {code}, not 0 after its restarts\n{job.tail()}")
    records = timing.glob("launch0.attempt*.rank0.json")
    attempts = sorted(int(p.name.split(".")[1].removeprefix("attempt")) for p in records)
    second = read_timing(timing, 0, attempts[-1], 0)
    check(second.get("finished") is True, f"{mode}: the restarted attempt did not finish")
    done = [
        (r, s, t) for r in range(NPROC) for (_, at, s, t) in steps_done(timing, r) if at == first
    ]
    last_before = max(t for _, _, t in done if t <= killed)
    newest_step = max(s for _, s, t in done if t <= killed)
    # Progress back where it was: the new attempt's first step past the
    # newest one done before the kill (the re-run steps' time included).
    back = min(
        t
        for r in range(NPROC)
        for (_, at, s, t) in steps_done(timing, r)
        if at == attempts[-1] and s > newest_step
    )
    return {
        "back_to_progress_s": back - last_before,
        "command": " ".join(job.command),
        "gap_s": second["first_step_done"] - last_before,
        "steps_rerun": newest_step - second["start_step"] + 1,
        "kill_to_restarted_process_s": second["process_start"] - killed,
        "startup_second_attempt_s": second["first_step_done"] - second["process_start"],
        # Where the restarted rank 0's start-up went: to the process group,
        # to building the loader, model and checkpointer, to finding and
        # loading the checkpoint, to the first step (DataLoader workers'
        # first batch included).
        "startup_parts_s": {
            "init_process_group": second["init_done"] - second["process_start"],
            "build": second["ready"] - second["init_done"],
            "resume": second["resumed"] - second["ready"],
            "first_step": second["first_step_done"] - second["resumed"],
        },
        "resumed_at_step": second["start_step"],
        "killed_after_step": newest_step,
        "restarts": attempts[-1],
    }


def memory(
    dir: Path, repeat: int, seed: int, modes: tuple[str, ...] = MEMORY_MODES
) -> dict[str, Any]:
    """The three modes, each killed after the same random steps; the final
    states of the memory mode checked bitwise against the disk-only run's."""
    rng = random.Random(seed)
    kills = [rng.randint(DISK_EVERY + 5, 2 * STEPS_PER_EPOCH - 10) for _ in range(repeat)]
    out: dict[str, Any] = {"kill_after_steps": kills, "modes": {}}
    finals: dict[str, list[Path]] = {}
    for mode in modes:
        samples = []
        for i, kill_after in enumerate(kills):
            sub = dir / f"{MEMORY_MODES.index(mode)}-{i}"
            sample = memory_crash_once(sub, mode, kill_after, rng)
            finals.setdefault(mode, []).append(sub / "final.pt")
            print(
                f"  {mode}: killed after step {sample['killed_after_step']}, resumed at "
                f"{sample['resumed_at_step']} ({sample['steps_rerun']} re-run), gap "
                f"{sample['gap_s']:.2f} s, back past step {sample['killed_after_step']} after "
                f"{sample['back_to_progress_s']:.2f} s (kill to restarted process "
                f"{sample['kill_to_restarted_process_s']:.2f} s)",
                flush=True,
            )
            samples.append(sample)
        out["modes"][mode] = {
            "steps_rerun": [s["steps_rerun"] for s in samples],
            "gap_s": statistics.median(s["gap_s"] for s in samples),
            "kill_to_restarted_process_s": statistics.median(
                s["kill_to_restarted_process_s"] for s in samples
            ),
            "startup_second_attempt_s": statistics.median(
                s["startup_second_attempt_s"] for s in samples
            ),
            "back_to_progress_s": statistics.median(s["back_to_progress_s"] for s in samples),
            "startup_parts_s": {
                part: statistics.median(s["startup_parts_s"][part] for s in samples)
                for part in samples[0]["startup_parts_s"]
            },
            "runs": samples,
        }
    reference = torch.load(finals["relaunch, disk only"][0])
    for mode in MEMORY_MODES[2:]:
        for path in finals[mode]:
            diff = equal_state(reference, torch.load(path))
            check(not diff, f"{mode}: the final state differs from disk only: {diff[:3]}")
        worst = max(out["modes"][mode]["steps_rerun"])
        check(worst <= 1, f"{mode} re-ran {worst} steps after a kill, more than 1")
    return out


NODES = 3
NODE_MODES = ("disk only", "memory_every=1, replica on the next node")


def wait_listening(port: int, proc: subprocess.Popen, mode: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        check(proc.poll() is None, f"{mode}: the first launcher exited before hosting the store")
        check(time.monotonic() < deadline, f"{mode}: the first launcher hosts no store in 60 s")
        time.sleep(0.05)


def node_lost_once(dir: Path, mode: str, kill_after: int) -> dict[str, Any]:
    """Three nodes (one launcher each on this machine, `--nnodes 2:3`, one
    rank each); the last launcher started (not the first, whose store the
    job uses: the others start once it listens) is SIGKILLed with its
    worker and its memory tier after step `kill_after`: the two left go on
    in a world of two, from disk or from memory (the lost node's part from
    its replica on the next node)."""
    timing = dir / "timing"
    dir.mkdir(parents=True)
    (dir / "shm").mkdir()
    train = ["--epochs", "2", "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    train += ["--step-time", str(STEP_TIME), "--num-workers", "2", "--ckpt-every", str(DISK_EVERY)]
    train += ["--ckpt-dir", str(dir / "ckpt"), "--timing", str(timing)]
    if "memory" in mode:
        train += ["--memory-every", "1"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        RELAUNCH, "run", "--nnodes", f"2:{NODES}", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", dir.name,
        "--rdzv-conf", "last_call_timeout=2,keep_alive_timeout=3", "--max-restarts", "3",
        "--monitor-interval", "0.2",
        "--shutdown-timeout", "5", "--snapshot-memory", "256MiB", str(TRAIN), *train,
    ]  # fmt: skip
    env = {**os.environ, "RELAUNCH_SNAPSHOT_ROOT": str(dir / "shm")}
    logs = [(dir / f"node{i}.log").open("w") for i in range(NODES)]
    procs: list[subprocess.Popen] = []
    try:
        for i in range(NODES):
            procs.append(
                subprocess.Popen(
                    command, stdout=logs[i], stderr=subprocess.STDOUT, env=env, cwd=dir
                )
            )
            if i == 0:
                # The first launcher hosts the store; the victim must not
                # (launchers started together race for the port).
                wait_listening(port, procs[0], mode)
        deadline = time.monotonic() + 300
        while not all(
            any(s >= kill_after for (_, at, s, _) in steps_done(timing, r) if at == 0)
            for r in range(NODES)
        ):
            check(all(p.poll() is None for p in procs), f"{mode}: a launcher exited early")
            check(time.monotonic() < deadline, f"{mode}: no step {kill_after} on every node")
            time.sleep(0.005)
        victim = procs[-1]
        killed = time.time()
        victim.kill()
        codes = [p.wait(300) for p in procs if p is not victim]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    check(codes == [0, 0], f"{mode}: the two nodes left exited {codes}")
    done = [(s, t) for r in range(NODES) for (_, at, s, t) in steps_done(timing, r) if at == 0]
    newest_step = max(s for s, t in done if t <= killed)
    last_before = max(t for s, t in done if t <= killed)
    records = timing.glob("launch0.attempt*.rank0.json")
    last = max(int(p.name.split(".")[1].removeprefix("attempt")) for p in records)
    second = read_timing(timing, 0, last, 0)
    check(second.get("finished") is True, f"{mode}: the world of two did not finish")
    return {
        "restarts": last,
        "killed_after_step": newest_step,
        "resumed_at_step": second["start_step"],
        "steps_rerun": newest_step - second["start_step"] + 1,
        "gap_s": second["first_step_done"] - last_before,
        "command": " ".join(command),
    }


def nodes(dir: Path, repeat: int, seed: int) -> dict[str, Any]:
    """A lost node, from disk and from the replica, after the same random steps."""
    rng = random.Random(seed)
    kills = [rng.randint(DISK_EVERY + 5, 2 * DISK_EVERY - 5) for _ in range(repeat)]
    out: dict[str, Any] = {"kill_after_steps": kills, "modes": {}}
    for m, mode in enumerate(NODE_MODES):
        samples = []
        for i, kill_after in enumerate(kills):
            sample = node_lost_once(dir / f"{m}-{i}", mode, kill_after)
            print(
                f"  {mode}: node lost after step {sample['killed_after_step']}, resumed at "
                f"{sample['resumed_at_step']} ({sample['steps_rerun']} re-run), gap "
                f"{sample['gap_s']:.2f} s",
                flush=True,
            )
            samples.append(sample)
        out["modes"][mode] = {
            "steps_rerun": [s["steps_rerun"] for s in samples],
            "gap_s": statistics.median(s["gap_s"] for s in samples),
            "runs": samples,
        }
    worst = max(out["modes"][NODE_MODES[1]]["steps_rerun"])
    check(worst <= 1, f"a lost node re-ran {worst} steps from the replica, more than 1")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["goodput", "crash", "memory", "nodes"], default=None)
    p.add_argument("--repeat", type=int, default=2, help="crash samples per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--skip-torchrun",
        action="store_true",
        help="--only memory without torchrun, whose restarted gloo mesh can time out here",
    )
    a = p.parse_args()
    dir = Path(tempfile.mkdtemp(prefix="relaunch-bench-preempt-"))
    result: dict[str, Any] = {}
    try:
        if a.only in (None, "goodput"):
            print("goodput under preemption", flush=True)
            g = goodput(dir / "goodput", a.seed)
            result["goodput"] = g
            med = statistics.median
            print(
                f"checked: {g['preemptions']} preemptions at steps {g['stop_steps']} "
                f"(positions in the epoch {g['stop_positions_in_epoch']}), 0 steps lost, final "
                f"state bitwise equal, {g['losses_checked']} losses stored once and equal\n\n"
                "| figure | value |\n|---|---|\n"
                f"| wall time, uninterrupted | {g['wall_uninterrupted_s']:.2f} s |\n"
                f"| wall time, {g['preemptions']} preemptions | {g['wall_preempted_s']:.2f} s |\n"
                f"| overhead per preemption | {g['overhead_per_preemption_s']:.2f} s |\n"
                f"| goodput | {g['goodput']:.3f} |\n"
                f"| start-up, uninterrupted | {g['startup_uninterrupted_s']:.2f} s |\n"
                f"| stop (median) | {med(g['stop_s']):.2f} s |\n"
                f"|   SIGTERM to agreed stop step | {med(g['stop_steps_to_agreed_s']):.2f} s |\n"
                f"|   stop step to launcher exit | {med(g['stop_agreed_to_exit_s']):.2f} s |\n"
                f"|     of which in the workers' shutdown code | "
                f"{med(g['stop_agreed_to_worker_exit_call_s']):.2f} s |\n"
                f"|     of which worker exit() to launcher exit | "
                f"{med(g['stop_worker_exit_call_to_launcher_exit_s']):.2f} s |\n"
                f"| restart (median) | {med(g['restart_s']):.2f} s |\n"
                f"| lost per preemption (median) | {med(g['lost_per_preemption_s']):.2f} s |\n",
                flush=True,
            )
            for name, t in g["tracker_goodput"].items():
                print(
                    f"tracker, {name}: goodput {t['goodput']:.3f}, wall {t['wall_s']:.2f} s, "
                    f"productive {t['productive_s']:.2f} s, start-up {t['startup_s']:.2f} s, "
                    f"stop {t['stop_s']:.2f} s, restart {t['restart_s']:.2f} s, re-run "
                    f"{t['rerun_s']:.2f} s ({t['steps_re_run']} steps)",
                    flush=True,
                )
        if a.only in (None, "crash"):
            print("restart latency after a crash", flush=True)
            rows = crash(dir, a.repeat, a.seed)
            result["crash"] = rows
            print("\n| workload | relaunch | target | ratio |\n|---|---|---|---|")
            for r in rows:
                print(f"| {r['name']} | {r['relaunch']:.2f} s | {r['peer']:.2f} s | "
                      f"{r['ratio']:.2f}x |")  # fmt: skip
        if a.only in (None, "memory"):
            print("a killed rank: disk checkpoints every 50 steps vs memory snapshots", flush=True)
            modes = MEMORY_MODES[1:] if a.skip_torchrun else MEMORY_MODES
            m = memory(dir / "memory", a.repeat, a.seed, modes)
            result["memory"] = m
            print("\n| mode | steps re-run | gap: last step to first after | back past the "
                  "last step | kill to new process |\n|---|---|---|---|---|")  # fmt: skip
            for mode, r in m["modes"].items():
                print(f"| {mode} | {r['steps_rerun']} | {r['gap_s']:.2f} s | "
                      f"{r['back_to_progress_s']:.2f} s | "
                      f"{r['kill_to_restarted_process_s']:.2f} s |")  # fmt: skip
            for mode, r in m["modes"].items():
                parts = ", ".join(f"{k} {v:.2f} s" for k, v in r["startup_parts_s"].items())
                print(f"{mode}: the restarted rank 0's start-up: {parts}")
        if a.only in (None, "nodes"):
            print(f"a lost node of {NODES}: disk checkpoints every 50 steps vs memory", flush=True)
            n = nodes(dir / "nodes", a.repeat, a.seed)
            result["nodes"] = n
            print("\n| mode | steps re-run | gap: last step to first after |\n|---|---|---|")
            for mode, r in n["modes"].items():
                print(f"| {mode} | {r['steps_rerun']} | {r['gap_s']:.2f} s |")
    except Failed as e:
        print(f"FAILED: {e}", file=sys.stderr, flush=True)
        print(f"(files kept in {dir})", file=sys.stderr)
        return 1
    path = write_result("preempt", result)
    print(f"\nresults in {path}")
    if not a.keep:
        shutil.rmtree(dir, ignore_errors=True)
    else:
        print(f"files in {dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
