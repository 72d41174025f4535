"""relaunch.integrations.transformers against the real transformers from
PyPI: a tiny BERT built from its config, trained by the Trainer on 2 ranks
(DDP on gloo, ``workers/hf_train.py``), stopped by SIGTERM the ways
schedulers send it, then relaunched with ``resume_from_checkpoint``. Every
stop must end with exit code 75 and the Trainer's own checkpoint of one
agreed step, and the resumed job must train exactly the batches of an
uninterrupted one and end with its parameters bit for bit (dropout
included: the checkpoint carries the RNG states)."""

from __future__ import annotations

from pathlib import Path

import pytest
from frameworks import (
    STOPS,
    WORKERS,
    hang_and_crash_are_handled,
    logged_once_across_a_preemption,
    reference_run,
    stop_and_resume,
)
from test_launch_tracking import events, get

pytest.importorskip("transformers")

TRAIN = WORKERS / "hf_train.py"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_run(tmp_path_factory.mktemp("hf-reference"), TRAIN)


@pytest.mark.parametrize(("how", "workers"), STOPS)
def test_a_stopped_trainer_job_resumes_exactly(reference, tmp_path, how, workers):
    def check_stop(out: Path, step: int, log: str) -> None:
        assert (out / "hf" / f"checkpoint-{step}" / "trainer_state.json").is_file()
        assert f"relaunch: stopped at step {step} for a preemption" in log, log

    stop_and_resume(reference, tmp_path, TRAIN, how, workers, check_stop)


def test_trainer_metrics_reach_the_run_once_and_failures_are_handled(
    tracking_server, reference, tmp_path
):
    logged_once_across_a_preemption(tracking_server, tmp_path, TRAIN, "hf-job")
    whole_run_summary_is_the_runs(tracking_server, tmp_path / "out")
    config = get(tracking_server, "/runs/hf-job")["config"]
    assert config["args"]["per_device_train_batch_size"] == 4, config
    assert config["model"]["hidden_size"] == 16, config
    hang_and_crash_are_handled(reference, tmp_path, TRAIN, r"forward, hf_train\.py")


def whole_run_summary_is_the_runs(server, out: Path) -> None:
    """Issue 34: the Trainer's end-of-training summary of the stopped
    attempt (its own steps) went into the run's metrics beside the resumed
    attempt's (the rest), and neither was the run's. Now the stopped
    attempt's is an event of it, and the run has one summary: the loss
    averaged over every step of both attempts, the runtimes added up."""
    points = {}
    for attempt in range(2):
        for key in ("train_loss", "train_runtime", "loss"):
            series = get(
                server, "/runs/hf-job/series", key=key, rank=0, attempt=attempt, buckets=100000
            )
            points[key, attempt] = [(p["step"], p["value"]) for p in series["points"]]
    assert points["train_loss", 0] == [] and len(points["train_loss", 1]) == 1, points
    stopped = [e for e in events(server, "hf-job") if e["kind"] == "summary"]
    assert len(stopped) == 1 and stopped[0]["attempt"] == 0, stopped
    first = stopped[0]["data"]
    assert "not the run's" in stopped[0]["text"], stopped
    (step, train_loss) = points["train_loss", 1][0]
    assert step == 24, points
    # The Trainer's own loss of each step (logging_steps=1), of both
    # attempts: their mean is the whole run's train_loss.
    losses = [v for a in range(2) for _, v in points["loss", a]]
    assert len(losses) == 24, points
    assert abs(train_loss - sum(losses) / 24) < 1e-3, (train_loss, losses)
    (_, runtime) = points["train_runtime", 1][0]
    assert runtime > first["train_runtime"] > 0, (runtime, first)
    stop = max(int(p.name.split("-")[1]) for p in (out / "hf").glob("checkpoint-*"))
    assert (out / "hf" / f"checkpoint-{stop}" / "relaunch_summary.json").is_file()
