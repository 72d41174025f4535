"""The README's framework examples (examples/frameworks/), run as a user
would: under relaunch run on 2 ranks, stopped by SIGTERM to the launcher
while they train (exit code 75, the framework's checkpoint of the agreed
step written), then run again with the same command to the end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import wait_for
from frameworks import launch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"


def lightning_underway(out: Path, log: Path) -> bool:
    return any((out / "ckpt").glob("epoch=*.ckpt"))


def printed(text: str):
    return lambda out, log: text in log.read_text()


@pytest.mark.parametrize(
    ("example", "framework", "underway"),
    [
        ("lightning_job.py", "lightning", lightning_underway),
        ("hf_job.py", "transformers", printed("'loss'")),
        ("accelerate_job.py", "accelerate", printed("epoch 0: loss")),
    ],
)
def test_an_example_is_stopped_and_resumed(tmp_path, example, framework, underway):
    pytest.importorskip(framework)
    started = time.monotonic()
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", EXAMPLES / example, "--out", out]
    job = launch(tmp_path, "first", *args)
    wait_for(
        lambda: underway(out, job.out) or job.proc.poll() is not None,
        300,
        f"{example} to be under way",
    )
    assert job.proc.poll() is None, job.finish()[1]
    job.proc.send_signal(15)
    code, log = job.finish()
    assert code == 75, log
    assert "every rank on this node stopped at step" in log, log
    assert "each with its checkpoint" in log, log
    # Within pytest's 300 s, so that a hang fails with the job's stacks.
    left = 280 - (time.monotonic() - started)
    code, log = launch(tmp_path, "second", *args).finish(timeout=max(left, 30))
    assert code == 0, log
    assert "[default0]:done: " in log and "[default1]:done: " not in log, log
