"""relaunch.compat.cycling_utils: code written against cycling_utils runs
with its import line changed, and the failures cycling_utils 0.0.3 has
(read from its source and reproduced there by our research) do not happen:

- keep_last=1 and a kill during a save: cycling_utils has deleted the only
  finished checkpoint before writing the new one, and leaves a dangling link;
- a resume with another world size: cycling_utils replays or skips samples;
- a stale ``NAME.latest_checkpoint_temp`` link: every later save fails;
- a relative output directory: the link's target does not resolve;
- one shuffle for every epoch.

The README-style training script (workers/cycling_train.py) runs under
``relaunch run`` with SIGKILLs and SIGTERMs at random moments and must end
bitwise where an uninterrupted run ends, every step's batch and loss equal.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from relaunch._subprocess import children
from relaunch.compat.cycling_utils import (
    AdvancedTooFarError,
    AtomicDirectory,
    HasNotResetProgressError,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleSampler,
    MetricsTracker,
    atomic_torch_save,
)

WORKERS = Path(__file__).resolve().parent / "workers"
TRAIN = WORKERS / "cycling_train.py"


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "RELAUNCH_STORE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


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


def test_saves_resume_and_keep_last_deletes_only_after_the_commit(tmp_path):
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=2)
    assert saver.symlink_name == "AtomicDirectory.latest_checkpoint"
    assert resume(tmp_path, saver) is None
    for value in range(4):
        save(saver, value, force=value == 1)
    assert resume(tmp_path, AtomicDirectory(tmp_path, keep_last=2)) == 3
    # keep_last=2 keeps the two newest; the forced one is kept too.
    assert saver.checkpointer.committed_steps() == [1, 2, 3]


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
        "with open(os.path.join(d, 'checkpoint.pt'), 'wb') as f:\n"
        "    f.write(b'half a checkpoint')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, timeout=120)
    assert out.returncode == -signal.SIGKILL
    saver = AtomicDirectory(tmp_path, is_master=True, keep_last=1)
    assert resume(tmp_path, saver) == 3  # the finished checkpoint survived the kill
    save(saver, 4)
    assert resume(tmp_path, AtomicDirectory(tmp_path, keep_last=1)) == 4
    assert saver.checkpointer.committed_steps() == [4]
    # The half-written save left nothing behind once the next saver started.
    assert sorted(p.name for p in (tmp_path / "AtomicDirectory").iterdir()) == [
        "latest", "step_00000004",
    ]  # fmt: skip


def test_a_stale_temporary_link_and_a_relative_directory_do_not_break_saves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("out")  # relative, as scripts often give it
    out.mkdir()
    # What a kill inside cycling_utils' link swap leaves behind.
    os.symlink("out/AtomicDirectory_checkpoint_9", out / "AtomicDirectory.latest_checkpoint_temp")
    saver = AtomicDirectory(out, is_master=True)
    save(saver, 7)
    assert not (out / "AtomicDirectory.latest_checkpoint_temp").is_symlink()
    link = out / saver.symlink_name
    assert os.path.isabs(os.readlink(link))
    monkeypatch.chdir("/")  # the link resolves from anywhere
    assert resume(tmp_path / "out", saver) == 7


def test_a_link_left_by_a_kill_before_the_first_commit_is_not_followed(tmp_path):
    os.symlink(tmp_path / "AtomicDirectory/latest", tmp_path / "AtomicDirectory.latest_checkpoint")
    saver = AtomicDirectory(tmp_path)
    assert not os.path.islink(tmp_path / saver.symlink_name)  # no checkpoint: no link


def test_async_and_mono_savers_each_keep_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    saver = AtomicDirectory(tmp_path, strategy="async")
    assert (saver.name, saver.is_master) == ("AtomicDirectory_rank_1", True)
    save(saver, 5)
    assert resume(tmp_path, saver) == 5
    assert (tmp_path / "AtomicDirectory_rank_1.latest_checkpoint").is_symlink()


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown strategy 'fast'; use one of 'sync_any'"):
        AtomicDirectory(tmp_path, strategy="fast")
    with pytest.raises(ValueError, match="keep_last must be an int"):
        AtomicDirectory(tmp_path, keep_last="3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name must be a non-empty file name"):
        AtomicDirectory(tmp_path, name="a/b")
    with pytest.raises(TypeError, match="output_directory must be a path"):
        AtomicDirectory(42)  # type: ignore[arg-type]
    saver = AtomicDirectory(tmp_path)
    with pytest.raises(RuntimeError, match="without prepare_checkpoint_directory"):
        saver.symlink_latest(tmp_path)
    directory = saver.prepare_checkpoint_directory()
    with pytest.raises(ValueError, match="is not the directory prepare_checkpoint_directory"):
        saver.symlink_latest(tmp_path)
    with pytest.raises(TypeError, match="force_save must be a bool"):
        saver.prepare_checkpoint_directory(force_save="yes")  # type: ignore[arg-type]
    # A save prepared again before it was finished: the first is abandoned.
    directory = saver.prepare_checkpoint_directory()
    saver.symlink_latest(directory)
    assert saver.checkpointer.committed_steps() == [0]
    with pytest.raises(TypeError, match="f must be a path"):
        atomic_torch_save({}, 3)  # type: ignore[arg-type]


def test_atomic_torch_save_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "state.pt"
    atomic_torch_save({"a": torch.ones(3)}, target)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        atomic_torch_save({"f": lambda: 0}, target)
    assert torch.equal(torch.load(target)["a"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # no temporary left


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


@pytest.mark.parametrize("new_world", [1, 2, 3, 4])
def test_a_resume_with_another_world_size_sees_every_sample_once(new_world):
    """cycling_utils, 20 samples, 2 ranks, 6 each consumed: 1 rank replays 6,
    3 ranks skip 6, 4 ranks raise AdvancedTooFarError."""
    data = list(range(20))
    before = [InterruptableDistributedSampler(data, 2, r, seed=3) for r in range(2)]
    seen = [i for s in before for i in consume(s, batches=3, batch=2)]
    state = before[0].state_dict()
    assert state == before[1].state_dict()
    after = [InterruptableDistributedSampler(data, new_world, r, seed=3) for r in range(new_world)]
    for s in after:
        s.load_state_dict(state)
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


def test_progress_len_set_epoch_and_old_states_behave_as_in_cycling_utils():
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
    # A state dict as cycling_utils saves it: read with this world size.
    t = InterruptableDistributedSampler(data, 2, 1)
    with pytest.warns(UserWarning, match="does not record its world size"):
        t.load_state_dict({"progress": 4, "epoch": 0})
    assert (t.epoch, t.progress, len(list(t))) == (0, 4, 6)
    with pytest.raises(AdvancedTooFarError, match="saved by fewer ranks"):
        t.load_state_dict({"progress": 11, "epoch": 0})
    with pytest.raises(TypeError, match="state must be a dict"):
        t.load_state_dict([4, 0])  # type: ignore[arg-type]


def test_the_single_process_sampler_takes_the_whole_dataset():
    s = InterruptableSampler(list(range(10)), num_replicas=4, rank=3, shuffle=False)
    assert InterruptibleSampler is InterruptableSampler
    assert list(s) == list(range(10)) and len(s) == 10


def test_metrics_tracker_sums_and_reports_per_epoch():
    m = MetricsTracker()
    m.update({"loss": 1.5, "n": 2}).update({"loss": 0.5, "n": 1}).reduce()
    m.reduce()  # nothing new: a no-op, not an error
    m.end_epoch()
    assert m.state_dict() == {"epoch_reports": [{"loss": 2.0, "n": 3.0}], "agg": {}}


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
