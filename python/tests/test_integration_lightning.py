"""relaunch.integrations.lightning against the real Lightning from PyPI: a
2-rank DDP job on gloo (``workers/lightning_train.py``: a plain
``DataLoader(shuffle=True)``, ``fit(ckpt_path="last")``) stopped by SIGTERM
the ways schedulers send it, then relaunched. Every stop must end with exit
code 75 and Lightning's own checkpoint of one agreed step, and the resumed
job must train exactly the batches of an uninterrupted one (mid-epoch
included) and end with its parameters bit for bit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from frameworks import WORKERS, assert_same_training, deliver, launch, wait_for_steps
from test_launch_tracking import get

pytest.importorskip("lightning")

TRAIN = WORKERS / "lightning_train.py"


def assert_same_params(reference: Path, resumed: Path) -> None:
    want, got = torch.load(reference / "params.pt"), torch.load(resumed / "params.pt")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted job: its traces and final parameters."""
    tmp = tmp_path_factory.mktemp("lightning-reference")
    job = launch(tmp, "reference", "--nproc-per-node", "2", TRAIN, tmp / "out")
    code, log = job.finish()
    assert code == 0, log
    return tmp / "out"


@pytest.mark.parametrize(
    ("how", "workers"),
    [("launcher", 0), ("every-process", 2), ("rank 1, at the end of an epoch", 2)],
)
def test_a_stopped_lightning_job_resumes_exactly(reference, tmp_path, how, workers):
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", TRAIN, out, "--workers", workers]
    if how.startswith("rank 1"):
        # Rank 1 signals itself at step 5: the ranks agree on step 8, the
        # last batch of epoch 0 (8 batches an epoch), where Lightning cannot
        # resume a checkpoint taken after the batch.
        job = launch(tmp_path, "first", *args, "--step-time", "0.15", "--signal-at", "5")
    else:
        job = launch(tmp_path, "first", *args, "--step-time", "0.15")
        wait_for_steps(job, out, 4)  # mid-epoch 0
        deliver(how, job)
    code, log = job.finish()
    assert code == 75, log
    match = re.search(
        r"every rank on this node stopped at step (\d+), each with its checkpoint", log
    )
    assert match, log
    step = int(match.group(1))
    if how.startswith("rank 1"):
        assert step == 8, log
    last = torch.load(out / "ckpt" / "last.ckpt", weights_only=False)
    assert last["global_step"] == step, (last["global_step"], step)
    assert "every rank stopped at the agreed step (preempted, exit code 75)" in log
    assert "Traceback" not in log, log

    code, log = launch(tmp_path, "second", *args).finish()
    assert code == 0, log
    assert_same_training(reference, out)
    assert_same_params(reference, out)


def test_without_the_callback_a_sigterm_is_not_a_clean_preemption(tmp_path):
    """Lightning handles SIGTERM itself: every rank leaves fit() with exit
    code 0, at no agreed step and with no checkpoint of it. relaunch says so
    and exits 143, not 75 (which says nothing was lost)."""
    out = tmp_path / "out"
    job = launch(tmp_path, "plain", "--nproc-per-node", "2", TRAIN, out, "--no-relaunch")
    job_steps = 4
    wait_for_steps(job, out, job_steps)
    deliver("launcher", job)
    code, log = job.finish()
    assert code == 128 + 15, log
    assert "did not stop at an agreed step" in log, log


def test_metrics_reach_the_run_once_across_a_preemption(tracking_server, tmp_path):
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", "--server", tracking_server.url, "--run-id", "lit-job"]
    args += [TRAIN, out, "--epochs", "2"]
    job = launch(tmp_path, "first", *args, "--step-time", "0.15")
    wait_for_steps(job, out, 6)
    deliver("launcher", job)
    assert job.finish()[0] == 75
    code, log = launch(tmp_path, "second", *args).finish()
    assert code == 0, log
    steps = 2 * 64 // 4 // 2  # epochs * batches a rank trains an epoch
    by_attempt = []
    for attempt in range(2):
        points = get(
            tracking_server,
            "/runs/lit-job/series",
            key="loss",
            rank=0,
            attempt=attempt,
            buckets=100000,
        )["points"]
        by_attempt.append([p["step"] for p in points])
    first, second = by_attempt
    assert first and second, by_attempt
    assert sorted(first + second) == list(range(steps)), by_attempt  # each step once
    run = get(tracking_server, "/runs/lit-job")
    # The hyperparameters Lightning logged (the relaunched attempt's: no
    # --step-time).
    assert run["config"]["step_time"] == 0.0 and run["config"]["crash_at"] == -1, json.dumps(run)
    files = [f["name"] for f in get(tracking_server, "/runs/lit-job/files")]
    assert "checkpoints/last.ckpt" in files, files


def test_a_hung_rank_is_reported_with_stacks_and_a_crashed_one_restarted(reference, tmp_path):
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "10"]
    code, log = launch(tmp_path, "hang", *args, TRAIN, out, "--hang-at", "5").finish()
    assert code == 0, log
    assert "relaunch: hang in attempt 0" in log, log
    assert re.search(r"rank 1: in training_step, lightning_train\.py:\d+", log), log  # its stack
    assert_same_params(reference, out)

    out = tmp_path / "crash"
    code, log = launch(tmp_path, "crash", *args, TRAIN, out, "--crash-at", "5").finish()
    assert code == 0, log
    assert re.search(r"rank 1 .*exit code 1", log), log
    assert_same_params(reference, out)
