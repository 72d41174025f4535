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
from test_launch_tracking import get

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
    config = get(tracking_server, "/runs/hf-job")["config"]
    assert config["args"]["per_device_train_batch_size"] == 4, config
    assert config["model"]["hidden_size"] == 16, config
    hang_and_crash_are_handled(reference, tmp_path, TRAIN, r"forward, hf_train\.py")
