"""``relaunch.dcp``: torch.distributed.checkpoint saving into relaunch's
committed checkpoints and loading from them, with real DCP, DTensors and
gloo under ``relaunch run``: saved by 2 ranks (``dcp.save`` and
``dcp.async_save``), loaded bitwise by 1 and by 3; a rank SIGKILLed after
writing its files commits nothing and leaves the checkpoints before it whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_checkpoint import WORKERS, child_env

import relaunch
from relaunch.errors import CheckpointError

JOB = WORKERS / "dcp_job.py"


def launch(ranks: int, *args: object) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", str(ranks)]
    cmd += ["--max-restarts", "0", str(JOB), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env())


def loaded(tmp_path: Path, directory: Path, ranks: int) -> list[dict]:
    out = tmp_path / f"loaded-{ranks}"
    job = launch(ranks, "load", directory, out)
    assert job.returncode == 0, job.stderr[-3000:]
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(ranks)]


def test_two_ranks_save_one_and_three_load_bitwise_and_a_kill_commits_nothing(tmp_path):
    directory = tmp_path / "ckpt"
    job = launch(2, "save", directory)
    assert job.returncode == 0, job.stderr[-3000:]
    ckpt = relaunch.Checkpointer(directory)
    assert ckpt.committed_steps() == [1, 2]
    latest = ckpt.latest(verify="full")
    assert latest is not None and latest.step == 2
    # DCP's own files, every rank's, under the manifest's hashes.
    assert ".metadata" in latest.files and len(latest.files) >= 3, latest.files
    for ranks in (1, 3):
        assert (
            loaded(tmp_path, directory, ranks)
            == [{"step": 2, "latest": 2, "bitwise": True}] * ranks
        )

    # Rank 1 killed after writing its files of step 3: nothing committed, the
    # job fails, and step 2 still verifies and loads.
    job = launch(2, "kill", directory)
    assert job.returncode != 0
    assert relaunch.Checkpointer(directory).committed_steps() == [1, 2]
    assert loaded(tmp_path, directory, 2) == [{"step": 2, "latest": 2, "bitwise": True}] * 2


@pytest.fixture
def one_process(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "TORCHELASTIC_")) or name in (
            "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        ):  # fmt: skip
            monkeypatch.delenv(name)


def test_one_process_saves_loads_and_refuses_what_cannot_be_committed(tmp_path, one_process):
    import torch
    import torch.distributed.checkpoint as dcp

    from relaunch.dcp import Reader, Writer

    ckpt = relaunch.Checkpointer(tmp_path / "c", save_every=10)
    state = {"a": torch.arange(6.0), "n": torch.tensor(3)}
    with Writer(ckpt, 5) as writer:  # forced: a DCP save is asked for
        dcp.save(state, storage_writer=writer)
    assert writer.committed is not None and writer.committed.step == 5
    back = {"a": torch.zeros(6), "n": torch.tensor(0)}
    dcp.load(back, storage_reader=Reader(ckpt))
    assert torch.equal(back["a"], state["a"]) and int(back["n"]) == 3
    # Not due and not forced: no save, said before anything is written.
    with pytest.raises(CheckpointError, match="no checkpoint is saved at step 7"):
        Writer(ckpt, 7, force=False)
    # A with-block left before DCP wrote abandons the save; the next one works.
    with Writer(ckpt, 8):
        pass
    with Writer(ckpt, 9) as writer:
        dcp.save(state, storage_writer=writer)
    assert ckpt.committed_steps() == [5, 9]
    with pytest.raises(ValueError, match="sync_files"):
        Writer(ckpt, 11, sync_files=False)
    with pytest.raises(TypeError, match=r"relaunch\.Checkpointer"):
        Writer(str(tmp_path), 12)  # type: ignore[arg-type]
    ckpt.close()


def test_a_reader_checks_what_it_is_given(tmp_path, one_process):
    from relaunch.dcp import Reader

    ckpt = relaunch.Checkpointer(tmp_path / "c")
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        Reader(ckpt)
    with pytest.raises(CheckpointError, match="not a committed checkpoint directory"):
        Reader(tmp_path)
    with ckpt.save(4) as path:
        (path / "x.bin").write_bytes(b"abc")
    committed = tmp_path / "c" / "step_00000004"
    assert Reader(committed).checkpoint.step == 4
    (committed / "x.bin").write_bytes(b"abcd")
    with pytest.raises(CheckpointError, match="does not verify"):
        Reader(committed)
    with pytest.raises(ValueError, match="verify"):
        Reader(ckpt, verify="some")
