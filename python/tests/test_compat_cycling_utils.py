"""relaunch.compat.cycling_utils: code written against cycling_utils 0.0.3
runs with its import line changed. Each test is written from cycling_utils'
README and source (read, never copied or fetched here):

- the saver keeps cycling_utils' layout (``NAME_checkpoint_N[_force]``
  directories, the ``NAME.latest_checkpoint`` link, the prepared directory
  is the checkpoint) and its ``sync_all`` rule for forced saves, with
  relaunch's commit: a kill never leaves the link on a torn checkpoint,
  ``keep_last`` deletes only after a commit, a stale ``_temp`` link or a
  relative output directory breaks nothing;
- the samplers' states load across the two packages, each epoch is
  shuffled anew, a resume with another world size sees every sample once;
  the grouped batch sampler, the sharded dataset, ``MetricsTracker`` (the
  sums stay in ``local`` after ``reduce()``) and ``TimestampedTimer``
  behave as there.

The README-style training script (workers/cycling_train.py) runs under
``relaunch run`` with SIGKILLs and SIGTERMs at random moments and must end
bitwise where an uninterrupted run ends, every step's batch and loss equal.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import wait_for
from torch.utils.data import DataLoader, DistributedSampler

import relaunch
from relaunch._checkpoint_files import verify_checkpoint
from relaunch._subprocess import StoreProcess, children
from relaunch.compat.cycling_utils import (
    AdvancedTooFarError,
    AtomicDirectory,
    DistributedShardedDataset,
    HasNotResetProgressError,
    InterruptableDistributedGroupedBatchSampler,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleSampler,
    MetricsTracker,
    TimestampedTimer,
    atomic_torch_save,
)
from relaunch.errors import CheckpointError

WORKERS = Path(__file__).resolve().parent / "workers"
TRAIN = WORKERS / "cycling_train.py"
LINK = "AtomicDirectory.latest_checkpoint"


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "TORCHELASTIC_")) or name in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)


# --- the saver ---------------------------------------------------------------


def save(saver: AtomicDirectory, value: int, force: bool = False) -> str:
    directory = saver.prepare_checkpoint_directory(force_save=force)
    assert os.listdir(directory) == []  # an empty directory, as cycling_utils gives
    atomic_torch_save({"value": value}, os.path.join(directory, "checkpoint.pt"))
    saver.symlink_latest(directory)
    return directory


def resume(out: Path, saver: AtomicDirectory) -> int | None:
    """What cycling_utils' README does to resume (os.path.exists follows the link)."""
    link = os.path.join(out, saver.symlink_name)
    if not os.path.exists(link):
        return None
    return torch.load(os.path.join(os.readlink(link), "checkpoint.pt"))["value"]


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_the_layout_is_cycling_utils_and_the_prepared_directory_is_the_checkpoint(tmp_path):
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=2)
    assert saver.symlink_name == LINK
    assert resume(tmp_path, saver) is None
    made = [save(saver, value, force=value == 1) for value in range(4)]
    assert made == [
        str(tmp_path / "AtomicDirectory_checkpoint_0"),
        str(tmp_path / "AtomicDirectory_checkpoint_1_force"),
        str(tmp_path / "AtomicDirectory_checkpoint_2"),
        str(tmp_path / "AtomicDirectory_checkpoint_3"),
    ]
    # The returned directory is the checkpoint: still there, linked by its path.
    assert os.readlink(tmp_path / LINK) == made[3]
    assert listing(Path(made[3])) == ["checkpoint.pt", "manifest.json"]
    manifest, problem = verify_checkpoint(Path(made[3]), 3, full=True)
    assert manifest is not None, problem
    assert sorted(manifest["files"]) == ["checkpoint.pt"]
    assert resume(tmp_path, AtomicDirectory(tmp_path, keep_last=2)) == 3
    # keep_last=2 keeps the two newest; the forced one is kept too.
    assert listing(tmp_path) == [
        LINK,
        "AtomicDirectory_checkpoint_1_force",
        "AtomicDirectory_checkpoint_2",
        "AtomicDirectory_checkpoint_3",
    ]
    assert saver.is_checkpoint_directory(made[1]) == "1_force"
    assert saver.is_checkpoint_directory(made[3]) == "3"
    assert saver.is_checkpoint_directory(made[0]) is None  # deleted
    assert saver.is_checkpoint_directory(tmp_path / LINK) is None


def test_keep_last_1_and_a_kill_during_a_save_keep_the_finished_checkpoint(tmp_path):
    """cycling_utils deletes checkpoint 3 when the save of 4 starts; a kill
    then leaves nothing and a dangling link (its next save: KeyError)."""
    script = (
        "import os, signal, sys, torch\n"
        "from relaunch.compat.cycling_utils import AtomicDirectory, atomic_torch_save\n"
        "saver = AtomicDirectory(sys.argv[1], is_master=True, keep_last=1)\n"
        "for value in range(4):\n"
        "    d = saver.prepare_checkpoint_directory()\n"
        "    atomic_torch_save({'value': value}, os.path.join(d, 'checkpoint.pt'))\n"
        "    saver.symlink_latest(d)\n"
        "d = saver.prepare_checkpoint_directory()\n"
        "assert sorted(os.listdir(sys.argv[1]))[-2:] == [\n"
        "    'AtomicDirectory_checkpoint_3', 'AtomicDirectory_checkpoint_4']  # never zero\n"
        "with open(os.path.join(d, 'checkpoint.pt'), 'wb') as f:\n"
        "    f.write(b'half a checkpoint')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, timeout=120)
    assert out.returncode == -signal.SIGKILL
    # What the kill left: the link on the finished checkpoint, the torn one beside it.
    assert listing(tmp_path) == [
        LINK, "AtomicDirectory_checkpoint_3", "AtomicDirectory_checkpoint_4",
    ]  # fmt: skip
    assert os.readlink(tmp_path / LINK) == str(tmp_path / "AtomicDirectory_checkpoint_3")
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=1)
    assert resume(tmp_path, saver) == 3  # the finished checkpoint survived the kill
    # The torn one went once the next saver started (index above the link's).
    assert listing(tmp_path) == [LINK, "AtomicDirectory_checkpoint_3"]
    save(saver, 4)
    assert resume(tmp_path, AtomicDirectory(tmp_path, keep_last=1)) == 4
    assert listing(tmp_path) == [LINK, "AtomicDirectory_checkpoint_4"]


def test_a_failure_just_before_the_link_moves_commits_nothing(tmp_path, monkeypatch):
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=1)
    save(saver, 0)
    directory = saver.prepare_checkpoint_directory()
    atomic_torch_save({"value": 1}, os.path.join(directory, "checkpoint.pt"))
    real_replace = os.replace

    def power_cut(src, dst, *args, **kwargs):
        if str(dst).endswith(LINK):
            raise OSError("simulated: the machine died here")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(OSError, match="the machine died here"):
        saver.symlink_latest(directory)
    monkeypatch.setattr(os, "replace", real_replace)
    # Complete, with its manifest, but never linked: not a checkpoint.
    assert (Path(directory) / "manifest.json").exists()
    assert resume(tmp_path, saver) == 0
    again = AtomicDirectory(tmp_path, is_master=True, keep_last=1)
    assert listing(tmp_path) == [LINK, "AtomicDirectory_checkpoint_0"]
    assert save(again, 1) == directory  # the same index, saved again


def test_a_stale_temporary_link_and_a_relative_directory_do_not_break_saves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("out")  # relative, as scripts often give it
    out.mkdir()
    # What a kill inside cycling_utils' link swap leaves behind.
    os.symlink("out/AtomicDirectory_checkpoint_9", out / f"{LINK}_temp")
    saver = AtomicDirectory(out, is_master=True)
    assert save(saver, 7) == str(tmp_path / "out" / "AtomicDirectory_checkpoint_0")
    assert not (out / f"{LINK}_temp").is_symlink()
    link = out / saver.symlink_name
    assert os.path.isabs(os.readlink(link))
    monkeypatch.chdir("/")  # the link resolves from anywhere
    assert resume(tmp_path / "out", saver) == 7


def cycling_utils_layout(out: Path, link_to: str | None, names: list[str]) -> None:
    """Directories and link as cycling_utils 0.0.3 leaves them (its saver
    links ``os.path.join(output_directory, NAME_checkpoint_N)``)."""
    for name in names:
        (out / name).mkdir()
        torch.save({"value": name}, out / name / "checkpoint.pt")
    if link_to is not None:
        os.symlink(os.path.join(out, link_to), out / LINK)


def test_switching_from_cycling_utils_resumes_its_checkpoints_and_numbers_on(tmp_path):
    names = [f"AtomicDirectory_checkpoint_{n}" for n in ("0", "1_force", "2", "3")]
    # Checkpoint 3 was being written when the job stopped: not linked.
    cycling_utils_layout(tmp_path, names[2], names)
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=1)
    assert resume(tmp_path, saver) == names[2]
    assert listing(tmp_path) == sorted([LINK, *names[:3]])  # the unfinished one is gone
    assert save(saver, 3) == str(tmp_path / names[3])
    # keep_last=1 after the commit: the older ones go, the forced one stays.
    assert listing(tmp_path) == [LINK, names[1], names[3]]


def test_directories_without_a_link_are_unfinished_saves_as_in_cycling_utils(tmp_path):
    names = ["AtomicDirectory_checkpoint_0", "AtomicDirectory_checkpoint_1"]
    cycling_utils_layout(tmp_path, None, names)
    (tmp_path / "other_checkpoint_0").mkdir()  # another saver's: untouched
    with pytest.warns(UserWarning, match="but no AtomicDirectory.latest_checkpoint link"):
        saver = AtomicDirectory(tmp_path, is_master=True)
    assert listing(tmp_path) == ["other_checkpoint_0"]
    assert save(saver, 0).endswith("AtomicDirectory_checkpoint_0")


def test_a_dangling_link_or_a_link_elsewhere_is_handled(tmp_path):
    # A link whose checkpoint was deleted by hand: numbering goes on after it.
    cycling_utils_layout(tmp_path, "AtomicDirectory_checkpoint_4", ["AtomicDirectory_checkpoint_2"])
    with pytest.warns(UserWarning, match="which does not exist: there is no checkpoint"):
        saver = AtomicDirectory(tmp_path)
    assert resume(tmp_path, saver) is None
    assert save(saver, 5).endswith("AtomicDirectory_checkpoint_5")
    assert listing(tmp_path) == [
        LINK, "AtomicDirectory_checkpoint_2", "AtomicDirectory_checkpoint_5",
    ]  # fmt: skip
    # A link to a directory of another kind, with none of ours: resumed from.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "x").mkdir()
    torch.save({"value": "x"}, other / "x" / "checkpoint.pt")
    os.symlink(other / "x", other / LINK)
    saver = AtomicDirectory(other)
    assert resume(other, saver) == "x"
    assert save(saver, 0).endswith("AtomicDirectory_checkpoint_0")
    # ... but with some of ours beside it, which one is meant is unclear.
    os.remove(other / LINK)
    os.symlink(other / "x", other / LINK)
    with pytest.raises(ValueError, match="not one of this saver's AtomicDirectory_checkpoint_N"):
        AtomicDirectory(other)


def test_async_and_mono_savers_each_keep_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    saver = AtomicDirectory(tmp_path, strategy="async")  # no store here: nothing to check with
    assert (saver.name, saver.is_master) == ("AtomicDirectory_rank_1", True)
    assert save(saver, 5, force=True).endswith("AtomicDirectory_rank_1_checkpoint_0_force")
    assert resume(tmp_path, saver) == 5
    assert (tmp_path / "AtomicDirectory_rank_1.latest_checkpoint").is_symlink()
    mono = AtomicDirectory(tmp_path, name="mine", strategy="mono")
    assert save(mono, 6).endswith("mine_checkpoint_0")
    assert resume(tmp_path, mono) == 6


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown strategy 'fast'; use one of 'sync_any'"):
        AtomicDirectory(tmp_path, strategy="fast")
    with pytest.raises(ValueError, match="keep_last must be an int"):
        AtomicDirectory(tmp_path, keep_last="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty file name"):
        AtomicDirectory(tmp_path, name="a/b")
    with pytest.raises(TypeError, match="output_directory must be a path"):
        AtomicDirectory(42)  # type: ignore[arg-type]
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        AtomicDirectory(tmp_path / "file")
    with pytest.raises(ValueError, match="needs a store to agree across 2 ranks"):
        AtomicDirectory(tmp_path, rank=0, world_size=2)
    saver = AtomicDirectory(tmp_path)
    with pytest.raises(RuntimeError, match="without prepare_checkpoint_directory"):
        saver.symlink_latest(tmp_path)
    directory = saver.prepare_checkpoint_directory()
    with pytest.raises(ValueError, match="is not the directory prepare_checkpoint_directory"):
        saver.symlink_latest(tmp_path)
    with pytest.raises(TypeError, match="force_save must be a bool"):
        saver.prepare_checkpoint_directory(force_save="yes")  # type: ignore[arg-type]
    # A save prepared again before it was finished: the first is abandoned.
    Path(directory, "half").write_text("abandoned")
    directory = saver.prepare_checkpoint_directory(force_save=torch.tensor(True))
    assert directory.endswith("AtomicDirectory_checkpoint_0_force")
    (Path(directory) / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match="name that file differently"):
        saver.symlink_latest(directory)
    assert not (tmp_path / LINK).exists()
    assert save(saver, 1).endswith("AtomicDirectory_checkpoint_0")
    assert listing(tmp_path) == [LINK, "AtomicDirectory_checkpoint_0", "file"]
    with pytest.raises(TypeError, match="f must be a path"):
        atomic_torch_save({}, 3)  # type: ignore[arg-type]


def test_atomic_torch_save_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "state.pt"
    atomic_torch_save({"a": torch.ones(3)}, target)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        atomic_torch_save({"f": lambda: 0}, target)
    assert torch.equal(torch.load(target)["a"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # no temporary left


KILLED_IN_SAVE = """
import sys, time
from pathlib import Path
from relaunch.compat.cycling_utils import atomic_torch_save

class Slow:
    def __reduce__(self):
        Path(sys.argv[2]).touch()  # the temporary file is open and half written
        time.sleep(600)
        return (dict, ())

atomic_torch_save({"slow": Slow()}, sys.argv[1])
"""


def test_a_save_killed_midway_leaves_no_temporary_file_past_the_next_save(tmp_path):
    """Issue 35: each SIGKILLed atomic_torch_save left its temporary file
    for good (12 kills, 8 files, 4x the checkpoint's size on disk). The
    next save of the same file removes those of processes that are gone,
    and any untouched for ten minutes (another host's), but not a live
    writer's."""
    target = tmp_path / "ckpt.pt"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_IN_SAVE)
    for n in range(2):
        ready = tmp_path / f"ready.{n}"
        child = subprocess.Popen([sys.executable, str(script), str(target), str(ready)])
        try:
            wait_for(ready.exists, 120, "the save to be under way")
        finally:
            child.kill()
            child.wait()
    # The second save removed the first's; its own is left.
    left = sorted(p.name for p in tmp_path.glob("ckpt.pt.tmp-*"))
    assert len(left) == 1 and f"-{child.pid}-" in left[0], left
    # Another host's, still being written, and one named the old way (no
    # host), untouched for an hour.
    live = tmp_path / "ckpt.pt.tmp-elsewhere-1-0a0a0a0a"
    live.write_bytes(b"x")
    old = tmp_path / "ckpt.pt.tmp-12345-0b0b0b0b"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    atomic_torch_save({"a": torch.ones(2)}, target)
    assert sorted(p.name for p in tmp_path.glob("ckpt.pt*")) == ["ckpt.pt", live.name]


# --- ranks agreeing through a store ---------------------------------------------


@pytest.fixture
def store():
    server = StoreProcess()
    yield server
    server.stop()


def ranks(world: int, body, *args) -> list:
    """``body(rank, *args)`` on ``world`` threads at once; their results, or
    the first exception (re-raised)."""
    results: list = [None] * world
    errors: list = [None] * world

    def run(rank: int) -> None:
        try:
            results[rank] = body(rank, *args)
        except BaseException as e:  # handed to the test
            errors[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a rank did not finish within 120 s"
    for e in errors:
        if e is not None:
            raise e
    return results


def saver_of(rank: int, out: Path, port: int, **kwargs) -> AtomicDirectory:
    connection = relaunch.Store("127.0.0.1", port, timeout=30, prefix="")
    return AtomicDirectory(
        out, is_master=rank == 0, rank=rank, world_size=2, store=connection, timeout=30, **kwargs
    )


@pytest.mark.parametrize("strategy", ["sync_any", "sync_all"])
def test_a_forced_save_is_kept_by_cycling_utils_rule(tmp_path, store, strategy):
    """sync_any: forced when any rank forces; sync_all: only when every rank does."""

    def body(rank: int) -> list[str]:
        saver = saver_of(rank, tmp_path, store.port, strategy=strategy)
        made = []
        for forces in [(False, False), (False, True), (True, False), (True, True)]:
            directory = saver.prepare_checkpoint_directory(force_save=forces[rank])
            # Every rank writes a file of its own into the one directory.
            torch.save({"rank": rank}, os.path.join(directory, f"rank{rank}.pt"))
            saver.symlink_latest(directory)
            made.append(os.path.basename(directory))
        return made

    per_rank = ranks(2, body)
    assert per_rank[0] == per_rank[1]  # one directory per save, the same on every rank
    one = "_force" if strategy == "sync_any" else ""
    assert per_rank[0] == [
        "AtomicDirectory_checkpoint_0",
        f"AtomicDirectory_checkpoint_1{one}",
        f"AtomicDirectory_checkpoint_2{one}",
        "AtomicDirectory_checkpoint_3_force",
    ]
    last = tmp_path / per_rank[0][-1]
    assert os.readlink(tmp_path / LINK) == str(last)
    manifest, problem = verify_checkpoint(last, 3, full=True)
    assert manifest is not None, problem
    assert sorted(manifest["files"]) == ["rank0.pt", "rank1.pt"]
    assert manifest["world_size"] == 2 and manifest["forced"]


def test_savers_built_with_different_strategies_are_refused(tmp_path, store):
    def body(rank: int) -> str:
        strategy = ["sync_any", "sync_all"][rank]
        with pytest.raises(ValueError) as refused:
            saver_of(rank, tmp_path, store.port, strategy=strategy)
        return str(refused.value)

    for message in ranks(2, body):
        assert message == (
            "AtomicDirectory 'AtomicDirectory' was built with different strategies "
            "(rank 0: 'sync_any', rank 1: 'sync_all'); build it with the same strategy on "
            "every rank"
        )


# --- the samplers ------------------------------------------------------------


def consume(sampler: InterruptableDistributedSampler, batches: int, batch: int) -> list[int]:
    taken: list[int] = []
    for index in sampler:
        taken.append(index)
        if len(taken) % batch == 0:
            sampler.advance(batch)
            if len(taken) == batches * batch:
                break
    return taken


def cycling_utils_order(data, world: int, rank: int, seed: int, shuffle: bool) -> list[int]:
    """The indices cycling_utils 0.0.3's InterruptableDistributedSampler
    gives rank ``rank`` in *every* epoch: DistributedSampler's for epoch 0,
    drawn once at construction."""
    return list(DistributedSampler(data, world, rank, shuffle=shuffle, seed=seed))


@pytest.mark.parametrize("new_world", [1, 2, 3, 4])
def test_a_resume_with_another_world_size_sees_every_sample_once(new_world):
    """cycling_utils, 20 samples, 2 ranks, 6 each consumed: 1 rank replays 6,
    3 ranks skip 6, 4 ranks raise AdvancedTooFarError."""
    data = list(range(20))
    before = [InterruptableDistributedSampler(data, 2, r, seed=3) for r in range(2)]
    seen = [i for s in before for i in consume(s, batches=3, batch=2)]
    states = [s.state_dict() for s in before]
    assert states[0] == states[1]  # rank 0's is enough
    after = [InterruptableDistributedSampler(data, new_world, r, seed=3) for r in range(new_world)]
    for s in after:
        s.load_state_dict(states[0])
        seen += list(s)
    assert sorted(set(seen)) == data
    assert len(seen) - len(data) < new_world  # only the epoch's last padding repeats


def test_every_epoch_has_distributed_samplers_order():
    data = list(range(23))
    ours = [InterruptableDistributedSampler(data, 2, r, seed=5) for r in range(2)]
    torchs = [DistributedSampler(data, 2, r, seed=5) for r in range(2)]
    orders = []
    for epoch in range(3):
        for o, t in zip(ours, torchs, strict=True):
            with o.in_epoch(epoch):
                t.set_epoch(epoch)
                assert list(o) == list(t)
                assert len(o) == len(t)
        orders.append(list(ours[0]))
    assert orders[0] != orders[1] != orders[2]  # shuffled anew each epoch


@pytest.mark.parametrize(("world", "epoch", "shuffle"), [(1, 0, True), (2, 0, True), (3, 2, False)])
def test_a_state_saved_here_resumes_cycling_utils_where_it_stopped(world, epoch, shuffle):
    """cycling_utils reads ``state["progress"]`` as the samples each rank
    consumed and goes on with ``indices[progress:]`` of its order."""
    data = list(range(22))
    ours = [InterruptableDistributedSampler(data, world, r, shuffle, seed=7) for r in range(world)]
    for s in ours:
        s.set_epoch(epoch)
        consume(s, batches=2, batch=3)
    for rank, s in enumerate(ours):
        state = s.state_dict()
        assert (state["progress"], state["epoch"]) == (6, epoch)  # this rank's 6 samples
        rest = cycling_utils_order(data, world, rank, seed=7, shuffle=shuffle)[state["progress"] :]
        assert rest == list(s)  # what an uninterrupted run takes next, index for index
    # A finished epoch (padding included) reads as every sample of the rank.
    for s in ours:
        consume(s, batches=len(s) - 6, batch=1)
        assert (
            s.state_dict()["progress"]
            == len(s)
            == len(cycling_utils_order(data, world, 0, 7, True))
        )


def test_going_back_to_cycling_utils_in_a_later_shuffled_epoch_is_inexact_as_documented():
    data = list(range(20))
    s = InterruptableDistributedSampler(data, 1, 0, seed=1)
    with s.in_epoch(0):
        consume(s, batches=len(s), batch=1)
    s.set_epoch(1)
    taken = consume(s, batches=2, batch=5)
    state = s.state_dict()
    # cycling_utils goes on in its one order, not this epoch's.
    rest = cycling_utils_order(data, 1, 0, seed=1, shuffle=True)[state["progress"] :]
    assert len(taken) + len(rest) == len(data)
    assert set(taken) | set(rest) != set(data)  # some seen twice, some not at all


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_state_cycling_utils_saved_finishes_its_epoch_exactly(world):
    """cycling_utils at epoch 3 (its order: epoch 0's), each rank 4 samples in."""
    data = list(range(17))
    state = {"progress": 4, "epoch": 3}
    ours = [InterruptableDistributedSampler(data, world, r, seed=11) for r in range(world)]
    for rank, s in enumerate(ours):
        with pytest.warns(UserWarning, match="does not record its world size"):
            s.load_state_dict(state)
        assert (s.epoch, s.progress) == (3, 4)
        theirs = cycling_utils_order(data, world, rank, seed=11, shuffle=True)
        assert list(s) == theirs[4:]  # the rest of its epoch, in its order
        # Saved again half-way and resumed, it still finishes that order.
        consume(s, batches=2, batch=1)
        again = InterruptableDistributedSampler(data, world, rank, seed=11)
        again.load_state_dict(s.state_dict())
        assert list(again) == theirs[6:]
        # The next epoch is DistributedSampler's, as every epoch here.
        consume(again, batches=len(theirs) - 6, batch=1)
        again.reset_progress()
        torch_sampler = DistributedSampler(data, world, rank, seed=11)
        torch_sampler.set_epoch(4)
        assert (again.epoch, list(again)) == (4, list(torch_sampler))


def test_the_single_process_sampler_takes_the_whole_dataset_and_reads_its_states():
    s = InterruptableSampler(list(range(10)), num_replicas=4, rank=3, shuffle=False)
    assert InterruptibleSampler is InterruptableSampler
    assert list(s) == list(range(10)) and len(s) == 10
    # cycling_utils' InterruptableSampler shuffles each epoch with seed + epoch.
    shuffled = InterruptableSampler(list(range(10)), seed=4)
    with pytest.warns(UserWarning, match="does not record its world size"):
        shuffled.load_state_dict({"progress": 3, "epoch": 2})
    order = torch.randperm(10, generator=torch.Generator().manual_seed(4 + 2)).tolist()
    assert list(shuffled) == order[3:]


def test_progress_len_set_epoch_and_states_behave_as_in_cycling_utils():
    data = list(range(20))
    s = InterruptableDistributedSampler(data, 2, 0)
    consume(s, batches=2, batch=3)
    assert (s.progress, len(s)) == (6, 10)  # this rank's samples; a whole epoch
    with pytest.raises(HasNotResetProgressError, match="call reset_progress"):
        s.set_epoch(1)
    s.set_epoch(0)  # the current epoch keeps its progress
    assert s.progress == 6
    with pytest.raises(AdvancedTooFarError, match="goes past the end"):
        s.advance(5)
    s.reset_progress()
    assert (s.epoch, s.progress) == (1, 0)  # a checkpoint now resumes at epoch 1
    s.set_epoch(1)
    t = InterruptableDistributedSampler(data, 2, 1)
    with pytest.warns(UserWarning, match="does not record its world size"):
        t.load_state_dict({"progress": 4, "epoch": 0})
    assert (t.epoch, t.progress, len(list(t))) == (0, 4, 6)
    with pytest.raises(AdvancedTooFarError, match="saved by fewer ranks"):
        t.load_state_dict({"progress": 11, "epoch": 0})
    with pytest.raises(ValueError, match=r"state\['epoch'\] must be an int >= 0"):
        t.load_state_dict({"progress": 1, "epoch": -1})
    with pytest.raises(TypeError, match="state must be a dict"):
        t.load_state_dict([4, 0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampler state is missing"):
        t.load_state_dict({"epoch": 0})
    # relaunch.InterruptibleSampler's own state (progress: the global count) loads too.
    mine = relaunch.InterruptibleSampler(data, 2, 0, auto_count=False)
    mine.advance(3)
    t.load_state_dict(mine.state_dict())
    assert t.progress == 3


def test_what_cycling_utils_own_tests_try_works():
    """Cases of cycling_utils' test_sampler.py: any seed DistributedSampler
    takes (a bool), an empty dataset, a state past the end."""
    data = list(range(5))
    s = InterruptableDistributedSampler(data, 1, 0, seed=True)
    assert list(s) == list(DistributedSampler(data, 1, 0, seed=1))
    empty = InterruptableDistributedSampler([], 1, 0, seed=False)
    with pytest.warns(UserWarning, match="does not record its world size"):
        empty.load_state_dict({"progress": 0, "epoch": 7})
    with empty.in_epoch(0):
        assert list(empty) == []
    with pytest.raises(AdvancedTooFarError):
        empty.load_state_dict({"progress": 1, "epoch": 0})


# --- the grouped batch sampler --------------------------------------------------


def test_grouped_batches_are_made_by_cycling_utils_rules():
    data = list(range(10))
    # Groups alternate; batches of 3: two full batches, then the two
    # buffers left (2 each) topped up with their group's first sample.
    s = InterruptableDistributedGroupedBatchSampler(data, [0, 1] * 5, 3, 1, 0, shuffle=False)
    assert list(s) == [[0, 2, 4], [1, 3, 5], [6, 8, 0], [7, 9, 1]]
    assert len(s) == 4
    # Ties go to the buffer begun first: group A's second buffer began after
    # B's (A's first batch filled at sample 2), so B's is topped up.
    s = InterruptableDistributedGroupedBatchSampler(data[:4], "ABAA", 2, 1, 0, shuffle=False)
    assert list(s) == [[0, 2], [1, 1]]
    # Two ranks, shuffled: ceil(share / batch size) batches, each of one
    # group, from the rank's DistributedSampler share (buffers left over
    # past the last batch are dropped, as there).
    groups = [i % 3 for i in range(50)]
    for rank in range(2):
        s = InterruptableDistributedGroupedBatchSampler(list(range(50)), groups, 4, 2, rank, seed=9)
        with s.in_epoch(2):
            share = DistributedSampler(list(range(50)), 2, rank, seed=9)
            share.set_epoch(2)
            batches = list(s)
            assert len(batches) == len(s) == math.ceil(25 / 4)
            assert all(len(b) == 4 and len({groups[i] for i in b}) == 1 for b in batches)
            assert {i for b in batches for i in b} <= set(share)


def test_the_grouped_sampler_counts_batches_and_resumes():
    data = list(range(30))
    groups = [i % 2 for i in range(30)]
    s = InterruptableDistributedGroupedBatchSampler(data, groups, 4, 2, 1, seed=2)
    with pytest.raises(NotImplementedError, match="in_epoch"):
        s.set_epoch(1)
    loader = DataLoader(data, batch_sampler=s)
    with pytest.raises(RuntimeError, match="stop"):
        with s.in_epoch(0):
            for step, _batch in enumerate(loader):
                s.advance()
                if step == 1:
                    raise RuntimeError("stop")
    state = s.state_dict()
    assert state == {"progress": 2, "epoch": 0, "num_replicas": 2}
    with pytest.raises(HasNotResetProgressError, match="call reset_progress"):
        with s.in_epoch(1):
            pass
    again = InterruptableDistributedGroupedBatchSampler(data, groups, 4, 2, 1, seed=2)
    again.load_state_dict(state)
    with again.in_epoch(again.epoch):
        assert list(again) == s.batches[2:]
        for _ in range(len(again) - 2):
            again.advance()
        with pytest.raises(AdvancedTooFarError, match="already consumed"):
            again.advance()
    assert (again.epoch, again.progress) == (1, 0)  # the epoch ended: the next is current
    # cycling_utils' own state (no world size) loads; one past the end does not.
    again.load_state_dict({"progress": 1, "epoch": 0})
    with pytest.raises(AdvancedTooFarError, match="past this rank's 4 batches"):
        again.load_state_dict({"progress": 5, "epoch": 0})
    # Another world size: the batches differ, so the epoch starts over.
    three = InterruptableDistributedGroupedBatchSampler(data, groups, 4, 3, 0, seed=2)
    with pytest.warns(UserWarning, match="epoch 0 starts over"):
        three.load_state_dict(state)
    assert three.progress == 0
    with pytest.raises(ValueError, match="one group id per sample"):
        InterruptableDistributedGroupedBatchSampler(data, [0], 4, 2, 0)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        InterruptableDistributedGroupedBatchSampler(data, groups, 0, 2, 0)


# --- metrics, timing, the sharded dataset --------------------------------------


def test_metrics_tracker_leaves_the_sums_in_local_after_reduce():
    """The ISC demo scripts' pattern: update, reduce, report from local, reset."""
    m = MetricsTracker()
    rates = []
    for loss, seen in [(6.0, 3), (2.0, 4)]:
        assert m.update({"loss": loss, "examples_seen": seen}) is m
        assert m.reduce() is m
        rpt = m.local
        rates.append(rpt["loss"] / rpt["examples_seen"])  # no ZeroDivisionError
        assert m.reset_local() is m and dict(m.local) == {}
    assert rates == [2.0, 0.5]
    assert dict(m.agg) == {"loss": 8.0, "examples_seen": 7.0}
    m.update({"loss": torch.tensor(1.0)}).reduce()  # a one-element tensor is a number
    assert m.reduce() is m  # reducing again reduces local again, as cycling_utils
    assert m.agg["loss"] == 10.0
    assert m.reset_local().reduce() is m  # nothing to reduce: a no-op here
    assert m.end_epoch() is m
    assert m.state_dict() == {"epoch_reports": [{"loss": 10.0, "examples_seen": 7.0}], "agg": {}}
    restored = MetricsTracker().load_state_dict(m.state_dict())
    assert restored.epoch_reports == m.epoch_reports
    restored.update({"new": 1}).reduce()
    assert restored.agg["new"] == 1.0
    with pytest.raises(TypeError, match="the value of 'loss' must be a number"):
        m.update({"loss": "high"})
    with pytest.raises(ValueError, match="'epoch_reports' and 'agg'"):
        m.load_state_dict({"agg": {}})


REDUCE_ON_TWO_RANKS = """
import json, sys, torch.distributed as dist
from relaunch.compat.cycling_utils import MetricsTracker
rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=rank, world_size=2)
m = MetricsTracker()
m.update({"loss": 1.5 * (rank + 1), "examples_seen": 2 ** 25 + rank}).reduce()
local = dict(m.local)
m.reset_local().update({"loss": 1.0, "examples_seen": 1}).reduce()
print(json.dumps({"local": local, "agg": dict(m.agg)}))
dist.destroy_process_group()
"""


def test_metrics_tracker_sums_over_the_ranks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    args = [sys.executable, "-c", REDUCE_ON_TWO_RANKS, str(tmp_path / "init")]
    procs = [
        subprocess.Popen([*args, str(r)], stdout=subprocess.PIPE, text=True, env=env)
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for out in outputs:
        got = json.loads(out.splitlines()[-1])
        # Both ranks' sums, exact past float32's 2**24.
        assert got["local"] == {"loss": 4.5, "examples_seen": 2**26 + 1}
        assert got["agg"] == {"loss": 6.5, "examples_seen": 2**26 + 3}


def test_timestamped_timer_prints_and_returns_as_cycling_utils(capsys, monkeypatch):
    import relaunch.compat.cycling_utils.timing as timing

    clock = iter([100.0, 102.5, 1336.0, 1400.0])
    monkeypatch.setattr(timing.time, "time", lambda: next(clock))
    timer = TimestampedTimer()
    assert timer.report("loaded", ret=True) == 2.5
    assert timer.start_time == 102.5
    assert timer.report("trained") is None
    lines = capsys.readouterr().out.splitlines()
    stamp = r"\[ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \] "
    assert re.fullmatch(stamp + "Start" + " " * 65 + " {7}0.000 ms, {9}0.00 s total", lines[0])
    assert re.fullmatch(stamp + "loaded" + " " * 64 + " {3}2,500.000 ms, {9}2.50 s total", lines[1])
    assert re.fullmatch(stamp + "trained +1,233,500.000 ms, {5}1,236.00 s total", lines[2])
    monkeypatch.setenv("RANK", "1")  # only rank 0 (or no RANK) prints
    TimestampedTimer("quiet", start_time=5.0, running=3.0).report("quiet too")
    assert capsys.readouterr().out == ""


def test_the_modules_and_names_are_cycling_utils():
    from relaunch.compat.cycling_utils import __all__ as names
    from relaunch.compat.cycling_utils.datasets import DistributedShardedDataset as D
    from relaunch.compat.cycling_utils.metrics import MetricsTracker as M
    from relaunch.compat.cycling_utils.sampler import InterruptableDistributedGroupedBatchSampler
    from relaunch.compat.cycling_utils.saving import AtomicDirectory as A
    from relaunch.compat.cycling_utils.timing import TimestampedTimer as T

    assert (D, M, A, T) == (
        DistributedShardedDataset,
        MetricsTracker,
        AtomicDirectory,
        TimestampedTimer,
    )
    assert InterruptableDistributedGroupedBatchSampler.__module__.endswith("cycling_utils.sampler")
    upstream = {
        "InterruptableDistributedSampler", "InterruptableDistributedGroupedBatchSampler",
        "InterruptableSampler", "DistributedShardedDataset", "atomic_torch_save",
        "AtomicDirectory", "MetricsTracker", "TimestampedTimer",
    }  # fmt: skip
    assert upstream <= set(names)


def image_folder(root: Path, counts: dict[str, int], suffix: str = ".txt") -> None:
    for cls, count in counts.items():
        (root / cls / "sub").mkdir(parents=True)
        for i in range(count):
            where = root / cls / ("sub" if i % 2 else "") / f"{i:02d}{suffix}"
            where.write_text(f"{cls}/{i}")
    (root / "b" / "notes.md").write_text("not a sample")


def read(path: str) -> str:
    return Path(path).read_text()


def test_distributed_sharded_dataset_deals_each_rank_its_shard(tmp_path):
    image_folder(tmp_path, {"b": 3, "a": 4, "c": 2})
    # torchvision's order: classes by name, then files by path.
    everything = [f"a/{i}" for i in (0, 2, 1, 3)] + ["b/0", "b/2", "b/1", "c/0", "c/1"]
    kwargs = {"loader": read, "extensions": (".txt",), "seed": 5}
    shards = [DistributedShardedDataset(tmp_path, r, 3, 1 / 3, **kwargs) for r in range(3)]
    expected = list(everything)
    random.Random(5).shuffle(expected)  # random.seed(seed), then random.shuffle
    for rank, shard in enumerate(shards):
        assert shard.classes == ["a", "b", "c"] and shard.class_to_idx == {"a": 0, "b": 1, "c": 2}
        assert shard.samples == expected[rank::3]  # ceil(9 / 3) = 3 each, dealt round-robin
        assert shard.targets == [shard.class_to_idx[s.split("/")[0]] for s in shard.samples]
        assert len(shard) == 3
    # The random module is seeded as cycling_utils leaves it.
    DistributedShardedDataset(tmp_path, 0, 1, 0.5, **kwargs)
    after = random.Random(5)
    after.shuffle(list(everything))
    assert random.random() == after.random()
    # More than a share wraps around; no shuffle keeps the folder order.
    big = DistributedShardedDataset(tmp_path, 1, 2, 0.7, shuffle=False, **kwargs)
    assert big.samples == [everything[(1 + 2 * k) % 9] for k in range(math.ceil(0.7 * 9))]
    # Transforms: at load, at each item; device_id stacks into tensors.
    on_cpu = DistributedShardedDataset(
        tmp_path, 0, 1, 1.0, device_id="cpu", shuffle=False,
        sample_load_transform=lambda s: torch.tensor([float(s[-1])]),
        target_getitem_transform=lambda t: t * 10, **{**kwargs, "seed": 0},
    )  # fmt: skip
    assert on_cpu.samples.shape == (9, 1) and on_cpu.targets.tolist() == [0] * 4 + [1] * 3 + [2] * 2
    sample, target = on_cpu[8]
    assert sample.tolist() == [1.0] and target.item() == 20


def test_distributed_sharded_dataset_reads_images_and_says_what_is_wrong(tmp_path):
    image = pytest.importorskip("PIL.Image")
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        image.new("L", (2, 3), color=7).save(tmp_path / cls / "one.PNG")
    shard = DistributedShardedDataset(tmp_path, 0, 1, 1.0)
    assert [(s.mode, s.size) for s in shard.samples] == [("RGB", (2, 3))] * 2
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2 ranks"):
        DistributedShardedDataset(tmp_path, 2, 2, 0.5)
    with pytest.raises(ValueError, match="samples_pct_per_replica must be a fraction"):
        DistributedShardedDataset(tmp_path, 0, 2, 0)
    with pytest.raises(ValueError, match="with is_valid_file, pass extensions=None"):
        DistributedShardedDataset(tmp_path, 0, 1, 1.0, is_valid_file=lambda p: True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DistributedShardedDataset(tmp_path / "nowhere", 0, 1, 1.0)
    with pytest.raises(FileNotFoundError, match="found no valid file for the class"):
        DistributedShardedDataset(tmp_path, 0, 1, 1.0, extensions=(".jpg",))
    with pytest.raises(ValueError, match="make sample_load_transform return a tensor"):
        DistributedShardedDataset(tmp_path, 0, 1, 1.0, device_id="cpu")


# --- a real job, killed at random moments --------------------------------------


def run_job(out: Path, trace: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_")}
    return subprocess.Popen(
        [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "2",
         "--shutdown-timeout", "10", TRAIN, out, trace, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=env,
    )  # fmt: skip


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def kill_everything(job: subprocess.Popen) -> None:
    """A lost machine: every process of the job SIGKILLed at once (frozen
    first, so that nothing starts in between)."""
    os.kill(job.pid, signal.SIGSTOP)
    pids = [job.pid, *descendants(job.pid)]
    for pid in pids:
        with_dead(os.kill, pid, signal.SIGSTOP)
    for pid in [job.pid, *descendants(job.pid), *pids]:
        with_dead(os.kill, pid, signal.SIGKILL)


def with_dead(f, *args) -> None:
    try:
        f(*args)
    except ProcessLookupError:
        pass


def steps(trace: Path) -> dict[tuple[int, int], set[str]]:
    """(epoch, step) -> every distinct record of it in the trace."""
    out: dict[tuple[int, int], set[str]] = {}
    for line in trace.read_text().splitlines():
        epoch, step, rest = line.split(" ", 2)
        out.setdefault((int(epoch), int(step)), set()).add(rest)
    return out


def test_a_cycling_utils_script_killed_at_random_moments_ends_as_an_uninterrupted_one(tmp_path):
    # 5 epochs of 13 steps of 0.1 s: longer than three interruptions, each up
    # to 1.5 s after its attempt's first step, can take to come.
    train = ("--epochs", "5")
    reference = run_job(
        tmp_path / "ref", tmp_path / "ref-trace", "--params", tmp_path / "ref.pt", *train
    )
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out

    seed = int(os.environ.get("RELAUNCH_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    trace, ckpt, params = tmp_path / "trace", tmp_path / "ckpt", tmp_path / "params.pt"
    how = ["SIGKILL", "SIGTERM", "SIGKILL"]
    attempts = []
    for attempt in range(8):
        job = run_job(ckpt, trace, "--params", params, *train)
        try:
            if attempt < len(how):
                # Once this attempt has trained a step or more, a moment later.
                start = trace.with_suffix(".0").stat().st_size if attempt else 0
                deadline = time.monotonic() + 120
                while job.poll() is None and time.monotonic() < deadline:
                    path = Path(f"{trace}.0")
                    if path.exists() and path.stat().st_size > start:
                        break
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 1.5))
                if job.poll() is None:
                    if how[attempt] == "SIGKILL":
                        kill_everything(job)
                    else:
                        job.send_signal(signal.SIGTERM)  # Kubernetes: PID 1 only
            out, _ = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                kill_everything(job)
                job.communicate(timeout=30)
        attempts.append(job.returncode)
        if job.returncode == 0:
            break
    assert attempts[-1] == 0, (seed, attempts, out)
    assert len(attempts) > len(how), (seed, attempts)  # every interruption happened
    for rank in range(2):
        want = steps(Path(f"{tmp_path / 'ref-trace'}.{rank}"))
        got = steps(Path(f"{trace}.{rank}"))
        assert got.keys() == want.keys(), (seed, rank)
        for key, records in got.items():
            assert records == want[key], (seed, rank, key)  # a redone step is the same step
    got_params, want_params = torch.load(params), torch.load(tmp_path / "ref.pt")
    for name, value in want_params.items():
        assert torch.equal(got_params[name], value), (seed, name)  # bitwise
    # cycling_utils' layout after the kills: the link and the one checkpoint
    # keep_last=1 keeps, committed; nothing half-written or temporary.
    names = listing(ckpt)
    assert len(names) == 2 and names[0] == LINK, names
    assert re.fullmatch(r"AtomicDirectory_checkpoint_\d+", names[1]), names
    assert os.readlink(ckpt / LINK) == str(ckpt / names[1])
    index = int(names[1].rsplit("_", 1)[1])
    assert verify_checkpoint(ckpt / names[1], index, full=True)[0] is not None
