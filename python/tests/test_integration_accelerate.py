"""relaunch.integrations.accelerate against the real accelerate from PyPI:
a training loop over ``accelerator.prepare``d model, optimizer and
DataLoader on 2 ranks (DDP on gloo, ``workers/accelerate_train.py``),
stopped by SIGTERM the ways schedulers send it, then relaunched. Every stop
must end with exit code 75 and accelerate's own checkpoint (``save_state``)
of one agreed step, and the resumed job must train exactly the batches of
an uninterrupted one and end with its parameters bit for bit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from frameworks import WORKERS, assert_same_training, deliver, launch, wait_for_steps
from test_launch_tracking import get

pytest.importorskip("accelerate")

TRAIN = WORKERS / "accelerate_train.py"


def assert_same_params(reference: Path, resumed: Path) -> None:
    want, got = torch.load(reference / "params.pt"), torch.load(resumed / "params.pt")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("accelerate-reference")
    code, log = launch(tmp, "reference", "--nproc-per-node", "2", TRAIN, tmp / "out").finish()
    assert code == 0, log
    return tmp / "out"


@pytest.mark.parametrize(
    ("how", "workers"),
    [("launcher", 0), ("every-process", 2), ("rank 1, at the end of an epoch", 0)],
)
def test_a_stopped_accelerate_loop_resumes_exactly(reference, tmp_path, how, workers):
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", TRAIN, out, "--workers", workers]
    if how.startswith("rank 1"):
        # Rank 1 signals itself during step 5 (counted from 0; 6 steps are
        # done after it): the ranks agree on step 8, the end of epoch 0.
        job = launch(tmp_path, "first", *args, "--step-time", "0.15", "--signal-at", "5")
    else:
        job = launch(tmp_path, "first", *args, "--step-time", "0.15")
        wait_for_steps(job, out, 4)
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
    checkpoint = out / "ckpt" / f"step_{step:08d}"
    assert (checkpoint / "model.safetensors").is_file(), sorted(checkpoint.iterdir())
    assert not list((out / "ckpt").glob(".partial-*"))

    code, log = launch(tmp_path, "second", *args).finish()
    assert code == 0, log
    assert_same_training(reference, out)
    assert_same_params(reference, out)


def test_accelerate_metrics_reach_the_run_once_and_failures_are_handled(
    tracking_server, reference, tmp_path
):
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", "--server", tracking_server.url, "--run-id", "acc-job"]
    job = launch(tmp_path, "first", *args, TRAIN, out, "--step-time", "0.15")
    wait_for_steps(job, out, 4)
    deliver("launcher", job)
    assert job.finish()[0] == 75
    code, log = launch(tmp_path, "second", *args, TRAIN, out).finish()
    assert code == 0, log
    steps = []
    for attempt in range(2):
        points = get(
            tracking_server,
            "/runs/acc-job/series",
            key="loss",
            rank=0,
            attempt=attempt,
            buckets=100000,
        )["points"]
        steps.append([p["step"] for p in points])
    assert sorted(steps[0] + steps[1]) == list(range(24)), steps  # each logged step once
    config = get(tracking_server, "/runs/acc-job")["config"]
    assert config == {"step_time": 0.0, "lr": 0.01}, config

    # A hung rank is reported with its stack, a crashed one restarted.
    common = ["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "10", TRAIN]
    code, log = launch(tmp_path, "hang", *common, tmp_path / "hang", "--hang-at", "5").finish()
    assert code == 0, log
    assert "relaunch: hang in attempt 0" in log, log
    assert re.search(r"rank 1: in main, accelerate_train\.py:\d+", log), log
    assert_same_params(reference, tmp_path / "hang")
    code, log = launch(tmp_path, "crash", *common, tmp_path / "crash", "--crash-at", "5").finish()
    assert code == 0, log
    assert re.search(r"rank 1 .*exit code 1", log), log
    assert_same_params(reference, tmp_path / "crash")
