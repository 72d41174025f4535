"""Issue 34: a loop of its own on relaunch.Checkpointer resumes bitwise with
dropout and random noise: every rank's generators are saved with the
checkpoint and put back, and the DataLoader's base seed drawn again on
resume no longer shifts them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parent / "workers" / "ckpt_rng_train.py"
RELAUNCH = [sys.executable, "-m", "relaunch"]
# 48 samples in batches of 4: 12 steps an epoch, 36 in all.


def _env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAUNCH_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }


def train(out: Path, ckpt: Path, *args: object, nproc: int = 1) -> subprocess.CompletedProcess:
    out.mkdir(exist_ok=True)
    if nproc == 1:
        command = [sys.executable, str(WORKER)]
    else:
        command = [*RELAUNCH, "run", "--nproc-per-node", str(nproc), str(WORKER)]
    done = subprocess.run(
        [*command, str(out), "--ckpt-dir", str(ckpt), *map(str, args)],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=out,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def params(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "params.pt")


def differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize(
    ("stop_at", "loader"),
    [
        (5, []),  # inside an epoch, no workers
        (11, ["--workers", "2"]),  # an epoch's last step: the next epoch draws its seed anew
        (17, ["--workers", "2", "--persistent"]),  # persistent workers: drawn once, at the start
    ],
    ids=["mid-epoch", "epoch-end-workers", "persistent-workers"],
)
def test_a_checkpointer_loop_with_dropout_resumes_bit_for_bit(tmp_path, stop_at, loader):
    train(tmp_path / "ref", tmp_path / "ref-ckpt", *loader)
    reference = params(tmp_path / "ref")
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    train(out, ckpt, "--stop-at", stop_at, *loader)
    saved = ckpt / f"step_{stop_at:08d}"
    assert (saved / "rng_state.0.json").is_file(), sorted(saved.iterdir())
    manifest = json.loads((saved / "manifest.json").read_text())
    assert "rng_state.0.json" in manifest["files"], manifest
    resumed = train(out, ckpt, *loader)
    assert "not restored" not in resumed.stderr, resumed.stderr
    got = params(out)
    assert differs(reference, got) == 0.0, f"max abs diff {differs(reference, got)}"


def test_without_rng_the_resume_differs_and_says_so_once(tmp_path):
    """What the saved generators buy: without them the same stop and
    resume ends elsewhere (so the test above can fail)."""
    train(tmp_path / "ref", tmp_path / "ref-ckpt")
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    train(out, ckpt, "--stop-at", 5, "--no-rng")
    saved = ckpt / "step_00000005"
    assert not list(saved.glob("rng_state.*")), sorted(saved.iterdir())
    resumed = train(out, ckpt, "--no-rng")
    assert resumed.stderr.count("the random generators are not restored: rng=False") == 1, (
        resumed.stderr
    )
    assert differs(params(tmp_path / "ref"), params(out)) > 0


def test_a_corrupt_random_state_file_is_named_with_what_to_do(tmp_path):
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    train(out, ckpt, "--stop-at", 3)
    saved = ckpt / "step_00000003"
    state = saved / "rng_state.0.json"
    state.write_text(state.read_text().replace('"format":1', '"format":7'))
    manifest_path = saved / "manifest.json"
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), "--ckpt-dir", str(ckpt)],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=out,
    )  # fmt: skip
    assert done.returncode != 0
    # The size is unchanged, so the manifest's check passes and the file's
    # own reading names it.
    assert manifest_path.is_file()
    assert f"{state} is not a readable random-state file" in done.stderr, done.stderr
    assert "remove it to resume without the saved random generators" in done.stderr, done.stderr


def test_two_ranks_each_resume_their_own_generators(tmp_path):
    train(tmp_path / "ref", tmp_path / "ref-ckpt", nproc=2)
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    train(out, ckpt, "--stop-at", 7, "--workers", "1", nproc=2)
    saved = ckpt / "step_00000007"
    assert {p.name for p in saved.glob("rng_state.*")} == {"rng_state.0.json", "rng_state.1.json"}
    train(out, ckpt, "--workers", "1", nproc=2)
    got = params(out)
    reference = params(tmp_path / "ref")
    assert differs(reference, got) == 0.0, f"max abs diff {differs(reference, got)}"


def test_rng_takes_a_bool(tmp_path):
    import relaunch

    with pytest.raises(TypeError, match=r"rng must be a bool .* not str"):
        relaunch.Checkpointer(tmp_path, rng="yes")
