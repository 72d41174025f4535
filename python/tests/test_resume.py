"""The whole story of a preempted job: a torch DDP job under `relaunch run
--server` gets SIGTERM mid-epoch, every rank stops at one step and commits
its checkpoint, the checkpoint is shipped to the tracking server, a fresh
directory pulls it back (a machine that never saw it), and the relaunched
job's loss trajectory equals an uninterrupted run's, step for step."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import torch
from conftest import wait_for

import relaunch

RESUME = Path(__file__).resolve().parents[2] / "examples" / "resume.py"
RELAUNCH = [sys.executable, "-m", "relaunch"]
# 2 ranks x batches of 8 over 384 samples: 24 steps an epoch, 48 in all.
TRAIN = ["--epochs", "2", "--samples", "384", "--batch-size", "8", "--ckpt-every", "10"]


def launch(
    *args: object, cwd: Path, env: dict[str, str] | None = None, nproc: int | str = 2
) -> subprocess.Popen:
    """`relaunch run --nproc-per-node NPROC ARGS`, outside any run of ours,
    with `env` added to the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_")} | (env or {})
    return subprocess.Popen(
        [*RELAUNCH, "run", "--nproc-per-node", str(nproc), *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out + err


def preempt(proc: subprocess.Popen, trajectory: Path, after: int = 30) -> tuple[int, str]:
    """SIGTERM to the launcher once the job has logged `after` losses; the
    job must exit 75 with every rank stopped at one step. Returns that step
    and the job's output."""
    try:
        wait_for(lambda: trajectory.exists() and len(trajectory.read_text().splitlines()) >= after,
                 180, f"the job to train past step {after}")  # fmt: skip
        proc.send_signal(signal.SIGTERM)
    finally:
        code, log = finish(proc)
    assert code == 75, log  # preempted: every rank stopped at the agreed step
    stops = {int(m) for m in re.findall(r"rank \d: preempted after step (\d+)", log)}
    assert len(stops) == 1, log  # every rank stopped at one step
    return stops.pop(), log


def losses(path: Path) -> list[tuple[int, str]]:
    return [(int(s), v) for s, v in (line.split() for line in path.read_text().splitlines())]


def test_a_preempted_job_resumes_elsewhere_with_the_same_loss_trajectory(tracking_server, tmp_path):
    server = tracking_server
    reference = tmp_path / "reference.txt"
    code, log = finish(
        launch(
            RESUME, "--ckpt-dir", tmp_path / "ref-ckpt", "--losses", reference, *TRAIN, cwd=tmp_path
        )
    )
    assert code == 0, log
    expected = losses(reference)
    assert [s for s, _ in expected] == list(range(48))

    trajectory = tmp_path / "trajectory.txt"
    first_dir = tmp_path / "machine-a" / "ckpt"
    job = ("--server", server.url, "--run-id", "job-r", RESUME, "--losses", trajectory, *TRAIN)
    # Steps of 0.1 s: the stop must land before the last step (47), 1.7 s after step 29.
    proc = launch(*job, "--ckpt-dir", first_dir, "--step-time", "0.1", cwd=tmp_path)
    # Mid-epoch, past the first periodic checkpoint (step 19).
    stop, log = preempt(proc, trajectory)
    assert 30 <= stop < 47, stop
    latest = relaunch.Checkpointer(first_dir).latest(verify="full")
    assert latest is not None and latest.step == stop  # committed at that step

    # The checkpoint reached the server: a new machine pulls it.
    second_dir = tmp_path / "machine-b" / "ckpt"
    pulled = subprocess.run(
        [*RELAUNCH, "ckpt", "pull", "job-r", second_dir, "--server", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pulled.returncode == 0, pulled.stderr
    assert f"step {stop}:" in pulled.stdout, pulled.stdout
    restored = relaunch.Checkpointer(second_dir).latest(verify="full")
    assert restored is not None and restored.step == stop

    code, log = finish(launch(*job, "--ckpt-dir", second_dir, cwd=tmp_path))
    assert code == 0, log
    assert f"starting at step {stop + 1}" in log
    assert losses(trajectory) == expected  # every step once, every loss equal


def test_pulling_what_was_never_shipped_says_so(tracking_server, tmp_path):
    server = tracking_server
    relaunch.init("p", id="empty-run", server=server.url, dir=tmp_path / "spool").finish(timeout=30)
    out = subprocess.run(
        [*RELAUNCH, "ckpt", "pull", "empty-run", tmp_path / "ckpt", "--server", server.url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "has no complete checkpoint" in out.stderr and "none was shipped" in out.stderr
    out = subprocess.run(
        [
            *RELAUNCH,
            "ckpt",
            "pull",
            "empty-run",
            tmp_path / "ckpt",
            "--step",
            "5",
            "--server",
            server.url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "no complete checkpoint of step 5" in out.stderr
    assert not (tmp_path / "ckpt" / "step_00000005").exists()


def test_four_ranks_resume_bitwise_without_find_unused_parameters(tmp_path):
    """Regression: examples/resume.py needed DDP(find_unused_parameters=True)
    for a bitwise resume on more than 2 ranks (DDP rebuilds its gradient
    buckets after a process's first backward, and gloo sums an element in
    an order that depends on its place in its bucket), and torch printed
    its warning on every rank of the demo. relaunch.ddp.rebuild_buckets
    rebuilds them before the first resumed step instead: without that call
    this test's losses differ from step 21 on."""
    four = ["--epochs", "2", "--samples", "768", "--batch-size", "8", "--ckpt-every", "10"]
    reference, ref_params = tmp_path / "reference.txt", tmp_path / "reference.pt"
    code, log = finish(
        launch(
            *(RESUME, "--ckpt-dir", tmp_path / "ref", "--losses", reference),
            *("--params", ref_params, *four),
            cwd=tmp_path,
            nproc=4,
        )
    )
    assert code == 0, log
    assert "find_unused_parameters" not in log, log
    trajectory, params = tmp_path / "trajectory.txt", tmp_path / "params.pt"
    job = (RESUME, "--ckpt-dir", tmp_path / "ckpt", "--losses", trajectory, "--params", params)
    stop, _ = preempt(
        launch(*job, *four, "--step-time", "0.1", cwd=tmp_path, nproc=4), trajectory, after=15
    )
    assert 15 <= stop < 47, stop
    code, log = finish(launch(*job, *four, cwd=tmp_path, nproc=4))
    assert code == 0, log
    assert losses(trajectory) == losses(reference)
    want, got = torch.load(ref_params), torch.load(params)
    assert all(torch.equal(want[k], got[k]) for k in want)
