"""relaunch.integrations.lightning against the real Lightning from PyPI: a
2-rank DDP job on gloo (``workers/lightning_train.py``: a plain
``DataLoader(shuffle=True)``, ``fit(ckpt_path="last")``) stopped by SIGTERM
the ways schedulers send it, then relaunched. Every stop must end with exit
code 75 and Lightning's own checkpoint of one agreed step, and the resumed
job must train exactly the batches of an uninterrupted one (mid-epoch
included) and end with its parameters bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from frameworks import (
    STOPS,
    WORKERS,
    deliver,
    hang_and_crash_are_handled,
    launch,
    logged_once_across_a_preemption,
    reference_run,
    stop_and_resume,
    wait_for_steps,
)
from test_launch_tracking import get

pytest.importorskip("lightning")

TRAIN = WORKERS / "lightning_train.py"

# Dropout, persistent DataLoader workers and accumulate_grad_batches=2:
# bitwise only when every random generator comes back, the resumed loader's
# base seed is drawn as the uninterrupted one's was, and the stop is at an
# optimizer step.
EXACT = ("--dropout", "0.1", "--accumulate", "2")
EXACT_STOPS = [("launcher", 2), ("every-process", 2), ("rank 1, at the end of an epoch", 2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_run(tmp_path_factory.mktemp("lightning-reference"), TRAIN)


@pytest.mark.parametrize(("how", "workers"), STOPS)
def test_a_stopped_lightning_job_resumes_exactly(reference, tmp_path, how, workers):
    """The epoch's-end case (rank 1, DataLoader workers): the loader draws
    its first indices before Lightning's set_epoch, so the resumed sampler
    must already be at the next epoch (it gave an empty epoch, and the job
    skipped one, before)."""

    def check_stop(out: Path, step: int, log: str) -> None:
        last = torch.load(out / "ckpt" / "last.ckpt", weights_only=False)
        assert last["global_step"] == step, (last["global_step"], step)
        assert "Traceback" not in log, log

    stop_and_resume(reference, tmp_path, TRAIN, how, workers, check_stop)


@pytest.fixture(scope="module")
def reference_exact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("lightning-exact")
    return reference_run(tmp, TRAIN, "--workers", 2, *EXACT)


@pytest.mark.parametrize(("how", "workers"), EXACT_STOPS)
def test_dropout_and_accumulation_resume_bit_for_bit(reference_exact, tmp_path, how, workers):
    """Before: Lightning's checkpoint held no random generator, so the
    resumed steps drew other dropout masks (max diff 1.92)."""

    def check_stop(out: Path, step: int, log: str) -> None:
        last = torch.load(out / "ckpt" / "last.ckpt", weights_only=False)
        assert last["global_step"] == step, (last["global_step"], step)
        (state,) = [v for k, v in last["callbacks"].items() if "RelaunchCallback" in k]
        assert len(state["rng"]) == 2, state.keys()

    stop_and_resume(
        reference_exact, tmp_path, TRAIN, how, workers, check_stop, extra=EXACT, signal_at=2
    )


def test_without_the_callback_a_sigterm_is_not_a_clean_preemption(tmp_path):
    """Lightning handles SIGTERM itself: every rank leaves fit() with exit
    code 0 at a batch of its own, with no checkpoint of it, or, when its
    handler's broadcast meets the other rank's per-batch one, the ranks hang
    until the grace period's SIGKILL, or one rank aborts (SIGABRT) or exits 1
    (gloo's "Connection closed by peer") when the other leaves the
    collective it waits in. Whichever, relaunch exits 143, not 75 (which
    says nothing was lost), and says why."""
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", "--shutdown-timeout", "10", TRAIN, out, "--no-relaunch"]
    job = launch(tmp_path, "plain", *args)
    wait_for_steps(job, out, 4)
    deliver("launcher", job)
    code, log = job.finish()
    assert code == 128 + 15, log
    assert "not every rank stopped cleanly at an agreed step" in log, log
    assert (
        "did not stop at an agreed step" in log
        or "killed after the 10s grace period" in log
        or "signal SIG" in log
        or "not every worker exited cleanly" in log
    ), log


def test_metrics_reach_the_run_once_across_a_preemption(tracking_server, tmp_path):
    logged_once_across_a_preemption(tracking_server, tmp_path, TRAIN, "lit-job")
    # The hyperparameters Lightning logged (the relaunched attempt's: no
    # --step-time), and the checkpoints ModelCheckpoint wrote.
    run = get(tracking_server, "/runs/lit-job")
    assert run["config"]["step_time"] == 0.0 and run["config"]["crash_at"] == -1, json.dumps(run)
    files = [f["name"] for f in get(tracking_server, "/runs/lit-job/files")]
    assert "checkpoints/last.ckpt" in files, files


def test_a_hung_rank_is_reported_with_stacks_and_a_crashed_one_restarted(reference, tmp_path):
    hang_and_crash_are_handled(reference, tmp_path, TRAIN, r"training_step, lightning_train\.py")
