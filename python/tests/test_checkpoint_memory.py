"""The memory tier: ``Checkpointer(memory_every=N)`` snapshots into the
directory ``relaunch run`` holds on the node, and resumes from whichever
tier holds the newest whole checkpoint.

The first tests run one process against a directory standing in for the
launcher's (``RELAUNCH_SNAPSHOT_DIR``); the last ones run real 2-rank DDP
jobs under ``relaunch run`` and kill a rank, or the launcher itself."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections import namedtuple
from pathlib import Path

import pytest

from relaunch import Checkpointer, CheckpointError
from relaunch._checkpoint_tier import ENV_SNAPSHOT_DIR, ENV_SNAPSHOT_MEMORY

WORKERS = Path(__file__).resolve().parent / "workers"
Pair = namedtuple("Pair", "a b")
MEMORY_TRAIN = WORKERS / "memory_train.py"
MiB = 2**20


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node memory tier as the launcher makes it, with a 64 MiB budget."""
    node = tmp_path / "shm"
    node.mkdir(mode=0o700)
    monkeypatch.setenv(ENV_SNAPSHOT_DIR, str(node))
    monkeypatch.setenv(ENV_SNAPSHOT_MEMORY, str(64 * MiB))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RELAUNCH_STORE"):
        monkeypatch.delenv(name, raising=False)
    return node


def save(ckpt: Checkpointer, step: int, data: bytes = b"x" * 1000) -> str | None:
    """One save as a training loop writes it; the tier it went to, or None."""
    with ckpt.save(step) as path:
        if path is None:
            return None
        (path / "state.bin").write_bytes(data + step.to_bytes(4, "little"))
    return "disk" if str(path).startswith(str(ckpt.dir)) else "memory"


def test_steps_between_disk_checkpoints_go_to_memory_and_latest_takes_the_newest(
    tmp_path: Path, tier: Path
) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", keep_last=2, save_every=5, memory_every=1)
    tiers = [save(ckpt, s) for s in range(12)]
    assert tiers == ["disk"] + ["memory"] * 4 + ["disk"] + ["memory"] * 4 + ["disk", "memory"]
    assert ckpt.committed_steps() == [5, 10]  # disk only, its own retention
    (memory,) = [p for p in tier.iterdir()]  # one directory per checkpointer
    assert sorted(p.name for p in memory.iterdir()) == ["latest", "step_00000011"]

    again = Checkpointer(tmp_path / "ckpt", keep_last=2, save_every=5, memory_every=1)
    newest = again.latest(verify="full")
    assert newest is not None and (newest.step, newest.tier) == (11, "memory")
    assert (newest.path / "state.bin").read_bytes()[-4:] == (11).to_bytes(4, "little")
    # Later saves must be after it, in either tier.
    with pytest.raises(ValueError, match="already holds a checkpoint of step 11"):
        save(again, 11)
    assert save(again, 12) == "memory"


def test_memory_every_spares_steps_it_does_not_divide(tmp_path: Path, tier: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=10, memory_every=3)
    assert [save(ckpt, s) for s in range(1, 11)] == [
        None, None, "memory", None, None, "memory", None, None, "memory", "disk"
    ]  # fmt: skip


@pytest.mark.parametrize("damage", ["no manifest", "torn manifest", "short file"])
def test_a_torn_snapshot_is_never_chosen(tmp_path: Path, tier: Path, damage: str) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=5, memory_every=1)
    for s in range(8):
        save(ckpt, s)
    (memory,) = list(tier.iterdir())
    newest = memory / "step_00000007"
    if damage == "no manifest":
        # A rank killed mid-snapshot: the temporary never got its final name.
        os.rename(newest, memory / "step_00000007.tmp-0123abcd-0123abcd")
    elif damage == "torn manifest":
        raw = (newest / "manifest.json").read_bytes()
        (newest / "manifest.json").write_bytes(raw[: len(raw) // 2])
    else:
        with open(newest / "state.bin", "r+b") as f:
            f.truncate(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = Checkpointer(tmp_path / "ckpt", save_every=5, memory_every=1).latest()
    # Only the newest snapshot is kept, so the job falls back to disk.
    assert found is not None and (found.step, found.tier) == (5, "disk")
    if damage != "no manifest":
        assert any("skipping checkpoint" in str(w.message) for w in caught)
    else:  # rank 0's cleanup removed the temporary
        assert not (memory / "step_00000007.tmp-0123abcd-0123abcd").exists()


def test_a_snapshot_that_cannot_fit_twice_is_an_error_saying_what_to_raise(
    tmp_path: Path, tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SNAPSHOT_MEMORY, str(3 * MiB))
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=5, memory_every=1)
    save(ckpt, 0)
    with pytest.raises(CheckpointError, match=r"takes 2\.0 MiB.*hold two.*--snapshot-memory"):
        save(ckpt, 1, b"y" * (2 * MiB - 4))
    latest = ckpt.latest()
    assert latest is not None and latest.step == 0
    assert not [p for p in next(tier.iterdir()).iterdir() if ".tmp-" in p.name]


def test_a_full_tier_skips_the_snapshot_keeps_the_last_and_trains_on(
    tmp_path: Path, tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_SNAPSHOT_MEMORY, str(8 * MiB))
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=100, memory_every=1)
    blob = b"z" * MiB
    assert save(ckpt, 1, blob) == "memory"
    # Something else takes the node's tier: another job's snapshot, say.
    hog = tier / "other"
    hog.mkdir()
    (hog / "big").write_bytes(b"h" * (6 * MiB))
    with pytest.warns(UserWarning, match=r"memory snapshot skipped: memory tier full.*step 2"):
        save(ckpt, 2, blob)  # returns: the training loop goes on
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once while the tier stays full
        save(ckpt, 3, blob)
    latest = ckpt.latest()
    assert latest is not None and (latest.step, latest.tier) == (1, "memory")
    (hog / "big").unlink()
    assert save(ckpt, 4, blob) == "memory"
    latest = ckpt.latest()
    assert latest is not None and latest.step == 4


def test_a_file_system_out_of_space_skips_the_snapshot(tmp_path: Path, tier: Path) -> None:
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=100, memory_every=1)
    save(ckpt, 1)
    with pytest.warns(UserWarning, match="memory snapshot skipped.*No space left"):
        with ckpt.save(2) as path:
            assert path is not None
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    latest = ckpt.latest()
    assert latest is not None and latest.step == 1
    # A disk save that runs out of space still raises: that is lost work.
    with pytest.raises(OSError, match="No space left"):
        with ckpt.save(100) as path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_save_async_snapshots_in_the_background(tmp_path: Path, tier: Path) -> None:
    torch = pytest.importorskip("torch")
    ckpt = Checkpointer(tmp_path / "ckpt", save_every=4, memory_every=1)
    weights = torch.arange(1000, dtype=torch.float32)
    for step in range(6):
        weights += 1
        assert ckpt.save_async({"w": weights}, step, "state.pt")
    ckpt.wait()
    latest = ckpt.latest()
    assert latest is not None and (latest.step, latest.tier) == (5, "memory")
    assert torch.equal(latest.load_file("state.pt")["w"], weights)
    ckpt.close()


def test_memory_every_needs_save_every_and_a_launcher(
    tmp_path: Path, tier: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="memory_every=2 needs save_every="):
        Checkpointer(tmp_path / "a", memory_every=2)
    with pytest.raises(ValueError, match="memory_every must be an int >= 1"):
        Checkpointer(tmp_path / "a", save_every=5, memory_every=0)
    monkeypatch.delenv(ENV_SNAPSHOT_DIR)
    with pytest.warns(UserWarning, match="needs a memory tier, which `relaunch run` provides"):
        ckpt = Checkpointer(tmp_path / "b", save_every=5, memory_every=1)
    assert [save(ckpt, s) for s in range(3)] == ["disk", None, None]


def test_a_snapshot_rounds_keys_are_deleted_as_a_disk_saves_are(
    tmp_path: Path, tier: Path, store_server
) -> None:
    """Two ranks snapshot every step: the store holds the same number of
    keys after 12 rounds as after 2 (before, a snapshot's round left its
    reports, outcome and commit keys behind: 8 more per step for 2 ranks)."""
    import threading

    import relaunch

    def connect() -> relaunch.Store:
        return relaunch.Store("127.0.0.1", store_server.port, timeout=30, prefix="")

    ckpts = [
        Checkpointer(tmp_path / "d", store=connect(), rank=r, world_size=2, save_every=1000,
                     memory_every=1)
        for r in range(2)
    ]  # fmt: skip
    errors: list[BaseException] = []

    def steps(rank: int, first: int, last: int) -> None:
        try:
            for step in range(first, last):
                with ckpts[rank].save(step) as path:
                    assert path is not None
                    (path / f"r{rank}.bin").write_bytes(b"x" * 100)
        except BaseException as e:
            errors.append(e)

    def run(first: int, last: int) -> int:
        threads = [threading.Thread(target=steps, args=(r, first, last)) for r in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors
        return connect().num_keys()

    after_two = run(1, 3)
    assert run(3, 13) == after_two
    assert ckpts[0].latest().tier == "memory"


@pytest.mark.parametrize(
    "local_world, strategy, says",
    [("3", "sync_any", "over nodes of different sizes"), ("2", "async", 'strategy="async"')],
)
def test_snapshots_a_node_could_not_resume_from_are_not_taken(
    tmp_path: Path, tier: Path, monkeypatch: pytest.MonkeyPatch, local_world, strategy, says
) -> None:
    """A snapshot's parts are named by node rank, so every node must run as
    many ranks; a rank saving alone ("async") would leave its snapshot on
    its own node only (test_checkpoint_nodes.py: what is served)."""
    for name, value in [
        ("LOCAL_WORLD_SIZE", local_world),
        ("GROUP_RANK", "0"),
        ("LOCAL_RANK", "0"),
    ]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RELAUNCH_STORE", "127.0.0.1:1")
    with pytest.warns(UserWarning, match=f"is not served .*{re.escape(says)}"):
        ckpt = Checkpointer(
            tmp_path / "c", save_every=5, memory_every=1, rank=0, world_size=4, strategy=strategy
        )
    assert ckpt._memory is None


# --- real jobs under relaunch run ------------------------------------------------------


def relaunch_cmd() -> list[str]:
    return [sys.executable, "-m", "relaunch", "run"]


def steps_of(out: Path, rank: int) -> list[tuple[int, int]]:
    path = out / f"steps.{rank}"
    if not path.exists():
        return []
    return [(int(a), int(s)) for a, s in (line.split() for line in path.read_text().splitlines())]


def worker_pid(launcher: int, rank: int) -> int:
    """The pid of the worker of ``launcher`` whose RANK is ``rank``."""
    for child in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return int(child)
    raise AssertionError(f"no worker of rank {rank} under launcher {launcher}")


def wait_for(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def run_job(
    tmp_path: Path,
    name: str,
    *args: str,
    kill_rank_at: int | None = None,
    kill_launcher_at: int | None = None,
    victim_rank: int = 1,
) -> Path:
    """`relaunch run` of memory_train.py on 2 ranks, its memory tier under
    tmp_path/shm; SIGKILL to rank 1 once it did `kill_rank_at` steps, or
    to the launcher itself (then launched again, as a scheduler would)."""
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    env = {**os.environ, "RELAUNCH_SNAPSHOT_ROOT": str(tmp_path / "shm")}
    env.pop(ENV_SNAPSHOT_DIR, None)
    (tmp_path / "shm").mkdir(exist_ok=True)
    command = [
        *relaunch_cmd(),
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--snapshot-memory",
        "64MiB",
        str(MEMORY_TRAIN),
        str(out),
        "--ckpt-dir",
        str(out / "ckpt"),
        *args,
    ]
    launcher = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        at = kill_rank_at if kill_rank_at is not None else kill_launcher_at
        if at is not None:
            wait_for(
                lambda: len(steps_of(out, 1)) >= at or launcher.poll() is not None,
                120,
                f"rank 1 to reach step {at}",
            )
            victim = (
                launcher.pid
                if kill_launcher_at is not None
                else worker_pid(launcher.pid, victim_rank)
            )
            os.kill(victim, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=300)
        if kill_launcher_at is not None:
            assert launcher.returncode == -signal.SIGKILL, output
            # Its workers die with it (parent-death signal); a new launcher.
            launcher = subprocess.Popen(
                command,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            output += "\n--- relaunched ---\n" + launcher.communicate(timeout=300)[0]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    (out / "launcher.log").write_text(output)
    assert launcher.returncode == 0, output
    return out


def assert_same_final_state(clean: Path, other: Path) -> None:
    import torch

    a = torch.load(clean / "final.pt")
    b = torch.load(other / "final.pt")
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for i, state in a["opt"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["opt"]["state"][i]["momentum_buffer"])


JOB = ("--memory-every", "1", "--save-every", "20", "--steps", "70", "--step-time", "0.03")


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The job uninterrupted: the state every interrupted run must end with."""
    pytest.importorskip("torch")
    return run_job(tmp_path_factory.mktemp("clean"), "clean", *JOB)


@pytest.mark.parametrize(
    "how, victim",
    # Rank 0 writes every snapshot: killed, it is often mid-snapshot.
    [("with-block", 1), ("save_async", 0)],
)
def test_a_killed_rank_resumes_from_memory_losing_at_most_one_step(
    tmp_path: Path, clean_run: Path, how: str, victim: int
) -> None:
    extra = ("--async-save",) if how == "save_async" else ()
    killed = run_job(tmp_path, "killed", *JOB, *extra, kill_rank_at=30, victim_rank=victim)
    output = (killed / "launcher.log").read_text()
    assert "restarting all workers" in output, output
    resumed = json.loads((killed / "resumed.1.0").read_text())
    assert resumed["tier"] == "memory", output
    assert f"resuming from the memory snapshot of step {resumed['step']}" in output
    for rank in (0, 1):
        steps = steps_of(killed, rank)
        first = [s for a, s in steps if a == 0]
        second = [s for a, s in steps if a == 1]
        assert second[0] == resumed["step"] + 1
        assert second[-1] == 69
        re_run = set(first) & set(second)
        assert len(re_run) <= 1, (rank, sorted(re_run))
    assert_same_final_state(clean_run, killed)
    # The launcher dropped the memory tier when it exited.
    assert list((tmp_path / "shm").iterdir()) == []


def test_a_killed_launcher_loses_the_memory_tier_and_the_job_resumes_from_disk(
    tmp_path: Path, clean_run: Path
) -> None:
    out = run_job(tmp_path, "launcher", *JOB, kill_launcher_at=30)
    output = (out / "launcher.log").read_text()
    relaunched = output.split("--- relaunched ---")[1]
    resumed = json.loads((out / "resumed.0.0").read_text())
    # The last launch's attempt 0 overwrote the first's record: it resumed
    # from the newest disk checkpoint, and said so.
    assert resumed["tier"] == "disk" and resumed["step"] % 20 == 0 and resumed["step"] >= 20
    assert f"resuming from disk, step {resumed['step']}" in relaunched, relaunched
    assert_same_final_state(clean_run, out)
    assert list((tmp_path / "shm").iterdir()) == []
