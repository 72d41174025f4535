"""``relaunch.Checkpointer``: commits that survive SIGKILL at any instant,
agreement across ranks through the store, retention, verification with
fallback, background saves, and the errors users see.

What the fault tests assert is the promise of the module: a checkpoint
whose ``with`` block returned is there after any kill (or a newer one is),
``latest()`` never returns a torn or partial checkpoint, and a checkpoint is
committed only when every rank's files are in.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import wait_for

import relaunch
from relaunch import Checkpointer, CheckpointError
from relaunch._checkpoint_tier import Tier
from relaunch._subprocess import StoreProcess

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(autouse=True)
def _single_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process checkpointers are rank 0 of 1 with no store, whatever the outer environment."""
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "TORCHELASTIC_")) or name in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)


def child_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RELAUNCH_", "TORCHELASTIC_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }


def save_files(ckpt: Checkpointer, step: int, **kwargs: object) -> Path | None:
    """One checkpoint with a torch file and a plain one; returns its final path."""
    with ckpt.save(step, **kwargs) as path:
        if path is None:
            return None
        torch.save({"step": step, "w": torch.full((100,), float(step))}, path / "model.pt")
        (path / "data.bin").write_bytes(bytes([step % 256]) * 1000)
    return ckpt.dir / f"step_{step:08d}"


def entries(directory: Path) -> list[str]:
    """What ``directory`` holds; nothing when it is not there (yet)."""
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


# --- crash consistency -------------------------------------------------------------

KILLS = 110


class Zygote:
    """``workers/ckpt_zygote.py``: forks save loops for :meth:`run_and_kill`."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "ckpt_zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.child = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def _next(self) -> str:
        try:
            line = self.lines.get(timeout=60)
        except queue.Empty:
            raise AssertionError("the zygote said nothing for 60 s") from None
        assert line != "EOF", f"the zygote died (exit code {self.proc.poll()})"
        return line

    def run_and_kill(self, directory: Path, delay: float) -> list[int]:
        """Starts a save loop, SIGKILLs it after ``delay`` s; returns the steps it committed."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{directory}\n")
        self.proc.stdin.flush()
        committed = []
        line = self._next()
        assert line.startswith("pid "), line
        self.child = int(line.split()[1])
        time.sleep(delay)  # the random instant of the kill, not a wait for a condition
        os.kill(self.child, signal.SIGKILL)
        while (line := self._next()) != f"reaped {self.child}":
            assert line.startswith("committed "), line
            committed.append(int(line.split()[1]))
        self.child = 0
        return committed

    def close(self) -> None:
        if self.child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def test_sigkill_at_random_instants_never_loses_a_commit_or_tears_a_file(
    tmp_path: Path, zygote: Zygote
) -> None:
    directory = tmp_path / "ckpt"
    rng = random.Random(20240605)
    acknowledged = -1  # newest step whose save returned in a killed process
    newest = -1
    killed_mid_save = 0
    kept = 0  # committed checkpoints on disk after the previous kill
    # The kill lands at a random instant of a child's life, drawn over about
    # two and a half of its saves: the seconds a child takes per commit are
    # measured as the test goes (never under 0.04), so a loaded machine,
    # whose saves are slower, is killed mid-save as often as an idle one.
    # A fixed 0-100 ms left most kills before the first save under two CPU
    # hogs (1 kill mid-save of 110).
    pace, lived, commits = 0.04, 0.0, 0
    for kill in range(KILLS):
        delay = rng.uniform(0.0, 2.5 * pace)
        committed = zygote.run_and_kill(directory, delay)
        lived, commits = lived + delay, commits + len(committed)
        pace = max(0.04, lived / max(1, commits))
        acknowledged = max([acknowledged, *committed])
        # keep_last=1: a reported commit was pruned down to itself before it was
        # reported, and a kill between a later commit and its prune adds one more.
        # A run that reported nothing can add at most that one.
        steps = [name for name in entries(directory) if re.fullmatch(r"step_\d+", name)]
        bound = 2 if committed else kept + 1
        assert len(steps) <= bound, f"kill {kill}: {steps} kept with keep_last=1"
        kept = len(steps)
        if any(".tmp-" in name for name in entries(directory)):
            killed_mid_save += 1
        with warnings.catch_warnings():
            # The newest commit must verify: no fallback, so no warning.
            warnings.simplefilter("error")
            latest = Checkpointer(directory, keep_last=1).latest(verify="full")
        if acknowledged < 0 and latest is None:
            continue
        assert latest is not None, f"kill {kill}: no checkpoint after step {acknowledged} returned"
        assert latest.step >= acknowledged, f"kill {kill}: step {acknowledged} was lost"
        assert latest.step >= newest, f"kill {kill}: went back from {newest} to {latest.step}"
        newest = latest.step
        state = latest.load_file("model.pt", weights_only=True)
        assert state["step"] == latest.step
        assert torch.equal(state["w"], torch.full((1 << 16,), float(latest.step)))
        if latest.metadata["kind"] == "sync":
            assert torch.equal(latest.load_file("optim.pt")["m"], torch.ones(1 << 15) * latest.step)
            rng_state = (latest.path / "rng" / "state.bin").read_bytes()
            assert rng_state == bytes([latest.step % 251]) * (4096 + latest.step)
    # The kills landed everywhere: before the first commit, mid-save, after many.
    assert killed_mid_save >= 10, killed_mid_save
    assert newest >= 10, newest
    # Construction removes the killed saves' temporaries but prunes nothing:
    # a reader's keep_last must not delete a run's checkpoints.
    ckpt = Checkpointer(directory, keep_last=1)
    left = entries(directory)
    assert left[0] == "latest" and left[-1] == f"step_{newest:08d}" and len(left) == 1 + kept, left
    # The next commit prunes what every kill between a commit and its prune left.
    save_files(ckpt, newest + 1)
    assert entries(directory) == ["latest", f"step_{newest + 1:08d}"]


# --- several ranks -------------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[StoreProcess]:
    server = StoreProcess()
    yield server
    server.stop()


def run_ranks(scenario: str, directory: Path, port: int, world: int = 3) -> list[subprocess.Popen]:
    script = [sys.executable, str(WORKERS / "ckpt_rank.py"), scenario, str(directory), str(port)]
    procs = [
        subprocess.Popen(
            [*script, str(rank), str(world)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        for rank in range(world)
    ]
    try:
        for p in procs:
            p.wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    return json.loads(out.splitlines()[-1])


def test_three_ranks_agree_on_saving_and_commit_every_ranks_files(
    tmp_path: Path, store: StoreProcess
) -> None:
    procs = run_ranks("agree", tmp_path, store.port)
    results = [result(p) for p in procs]
    # sync_any: due steps (save_every=10) and the one rank 1 forced, on every rank.
    assert [r["any"] for r in results] == [[0, 10, 13, 20]] * 3
    # sync_all: rank 1 alone forcing step 13 saves nothing; all forcing step 14 saves.
    assert [r["all"] for r in results] == [[0, 10, 14]] * 3
    ckpt = Checkpointer(tmp_path / "any")
    assert ckpt.committed_steps() == [0, 10, 13, 20]
    latest = ckpt.latest(verify="full")
    assert latest is not None and latest.step == 20
    assert sorted(latest.files) == [
        "rank0.bin", "rank1.bin", "rank2.bin",
        "rng_state.0.json", "rng_state.1.json", "rng_state.2.json",
    ]  # fmt: skip
    assert latest.manifest["world_size"] == 3
    forced = [s for s in ckpt.committed_steps() if _forced(tmp_path / "any", s)]
    assert forced == [13]
    assert Checkpointer(tmp_path / "all").committed_steps() == [0, 10, 14]


def _forced(directory: Path, step: int) -> bool:
    return json.loads((directory / f"step_{step:08d}" / "manifest.json").read_text())["forced"]


def test_a_rank_killed_while_writing_means_no_commit(tmp_path: Path, store: StoreProcess) -> None:
    procs = run_ranks("die", tmp_path, store.port)
    assert procs[2].returncode == -signal.SIGKILL
    for p in procs[:2]:
        error = result(p)["error"]
        assert "timed out" in error and "rank(s) 2 did not get there" in error, error
    directory = tmp_path / "die"
    assert any(".tmp-" in name for name in entries(directory))
    latest = Checkpointer(directory).latest(verify="full")  # rank 0: cleans the leftovers
    assert latest is not None and latest.step == 0
    assert entries(directory) == ["latest", "step_00000000"]


def test_an_exception_or_a_different_step_on_one_rank_aborts_the_save_on_all(
    tmp_path: Path, store: StoreProcess
) -> None:
    procs = run_ranks("raise", tmp_path, store.port)
    results = [result(p) for p in procs]
    assert results[1]["error"] == "RuntimeError: out of disk space (simulated)"
    for r in (results[0], results[2]):
        assert r["error"].startswith("CheckpointError: checkpoint aborted: rank 1: RuntimeError")
    assert all(r["saved_2"] for r in results)
    for r in results:
        assert r["mismatch"] == (
            "ranks called save() with different steps (rank 0: 3, rank 1: 3, rank 2: 4); "
            "every rank must call save() at the same step"
        )
    assert all(r["saved_5"] for r in results)
    directory = tmp_path / "raise"
    # Step 1 never committed; rank 0 removed its directory when step 2 began.
    assert entries(directory) == ["latest", "step_00000000", "step_00000002", "step_00000005"]
    assert os.readlink(directory / "latest") == "step_00000005"


def test_under_relaunch_run_ranks_agree_through_the_launchers_store(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    launch = [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "2", "--max-restarts"]
    job = subprocess.run(
        [*launch, "1", str(WORKERS / "ckpt_launched.py"), str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert job.returncode == 0, job.stderr
    # Attempt 0: due steps 0, 3, 6 and step 4 that rank 1 forced; rank 0 died at
    # step 7. Attempt 1 resumed after step 6 and saved step 9.
    expected = "0 0\n0 3\n0 4\n0 6\n1 9\n"
    assert [(tmp_path / f"saved.{r}").read_text() for r in (0, 1)] == [expected] * 2
    ckpt = Checkpointer(directory)
    assert ckpt.committed_steps() == [0, 3, 4, 6, 9]
    latest = ckpt.latest(verify="full")
    assert latest is not None and sorted(latest.files) == [
        "rank0.txt", "rank1.txt", "rng_state.0.json", "rng_state.1.json"
    ]  # fmt: skip
    assert (latest.path / "rank1.txt").read_text() == "1 9\n"


def test_under_relaunch_run_a_rank_in_the_vote_learns_of_a_dead_peer_from_the_launcher(
    tmp_path: Path,
) -> None:
    """End to end: the launcher sets `workers/failed` when rank 1 is SIGKILLed, and
    rank 0, blocked in the checkpoint vote (timeout 600 s) and handling the
    launcher's SIGTERM itself, raises naming rank 1 within seconds,
    long before the 60 s shutdown grace would end it."""
    launch = [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "2"]
    launch += ["--max-restarts", "0", "--shutdown-timeout", "60"]
    began = time.monotonic()
    job = subprocess.run(
        [*launch, str(WORKERS / "ckpt_dead_peer.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    took = time.monotonic() - began
    assert job.returncode != 0, job.stderr
    waited, message = (tmp_path / "raised").read_text().split("\n", 1)
    assert float(waited) < 5, f"rank 0 waited {waited} s after rank 1 died"
    assert "rank 1" in message and "SIGKILL" in message, message
    assert took < 40, f"the job took {took:.1f} s"
    assert Checkpointer(tmp_path / "ckpt").committed_steps() == []


# --- commit, layout, abort -------------------------------------------------------------


def test_commit_layout_and_manifest(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None)
    path = save_files(ckpt, 7, metrics={"loss": 0.5}, metadata={"epoch": 2})
    assert path == tmp_path / "step_00000007"
    assert entries(tmp_path) == ["latest", "step_00000007"]
    assert os.readlink(tmp_path / "latest") == "step_00000007"
    assert entries(path) == ["data.bin", "manifest.json", "model.pt", "rng_state.0.json"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["world_size"] == 1
    assert manifest["metrics"] == {"loss": 0.5} and manifest["metadata"] == {"epoch": 2}
    assert manifest["files"]["data.bin"] == {
        "size": 1000,
        "blake3": relaunch._native.hash_bytes(bytes([7]) * 1000),
    }
    latest = ckpt.latest(verify="full")
    assert latest is not None and latest.step == 7 and latest.path == path
    assert latest.load_file("model.pt")["step"] == 7
    assert ckpt.load()["step"] == 7


def test_an_exception_in_the_block_commits_nothing_and_propagates(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    save_files(ckpt, 1)
    with pytest.raises(ZeroDivisionError), ckpt.save(2) as path:
        (path / "half.bin").write_bytes(b"x")
        _ = 1 / 0
    assert entries(tmp_path) == ["latest", "step_00000001"]
    save_files(ckpt, 2)  # the same step can be tried again
    assert ckpt.committed_steps() == [1, 2]


def test_save_every_and_force(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None, save_every=5)
    saved = [s for s in range(12) if save_files(ckpt, s, force=s == 7)]
    assert saved == [0, 5, 7, 10]


def test_relative_directory_is_resolved_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ckpt = Checkpointer("runs/ckpt")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    save_files(ckpt, 3)
    assert ckpt.dir == tmp_path / "runs" / "ckpt"
    assert (tmp_path / "runs" / "ckpt" / "step_00000003" / "manifest.json").exists()
    assert not (tmp_path / "elsewhere" / "runs").exists()


def test_stale_temporaries_are_cleaned_at_construction(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    save_files(ckpt, 1)
    (tmp_path / "step_00000002.tmp-0123abcd-89ab").mkdir()
    (tmp_path / "step_00000002.tmp-0123abcd-89ab" / "model.pt").write_bytes(b"torn")
    (tmp_path / "step_00000000.old-0123abcd-1111").mkdir()
    os.symlink("step_00000001", tmp_path / "latest.tmp-0123abcd-2222")
    (tmp_path / "notes.txt").write_text("not ours")
    (tmp_path / "step_9.tmp").mkdir()  # not our naming: left alone
    Checkpointer(tmp_path)
    assert entries(tmp_path) == ["latest", "notes.txt", "step_00000001", "step_9.tmp"]


def test_async_strategy_commits_one_ranks_files_alone(tmp_path: Path) -> None:
    # No store needed: rank 0 of 3 saves when it wants and does not wait for anyone.
    ckpt = Checkpointer(tmp_path, strategy="async", rank=0, world_size=3)
    save_files(ckpt, 4)
    latest = ckpt.latest()
    assert latest is not None and latest.manifest["world_size"] == 1
    assert latest.manifest["rank"] == 0


# --- retention ---------------------------------------------------------------------------


def test_keep_last(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=2)
    for s in range(5):
        save_files(ckpt, s)
    assert ckpt.committed_steps() == [3, 4]


def test_keep_every_and_forced(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=1, keep_every=3)
    for s in range(8):
        save_files(ckpt, s, force=s == 5)
    assert ckpt.committed_steps() == [0, 3, 5, 6, 7]


@pytest.mark.parametrize(
    ("spec", "kept"),
    [(("loss", "min"), [1, 4]), (("loss", "max"), [0, 4]), (("loss", "min", 2), [1, 3, 4])],
)
def test_keep_best(tmp_path: Path, spec: tuple, kept: list[int]) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=1, keep_best=spec)
    for s, loss in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):
        save_files(ckpt, s, metrics={"loss": loss})
    assert ckpt.committed_steps() == kept


def test_keep_last_1_interrupted_between_commit_and_prune_keeps_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=1)
    save_files(ckpt, 1)

    def die(self: Tier, step: int, session: str) -> None:
        raise KeyboardInterrupt  # the process dies right after the commit

    monkeypatch.setattr(Tier, "prune", die)
    with pytest.raises(KeyboardInterrupt):
        save_files(ckpt, 2)
    monkeypatch.undo()
    resumed = Checkpointer(tmp_path, keep_last=1)
    assert resumed.committed_steps() == [1, 2]
    latest = resumed.latest()
    assert latest is not None and latest.step == 2
    save_files(resumed, 3)
    assert resumed.committed_steps() == [3]


# --- verification and fallback --------------------------------------------------------


def corrupt_bitflip(path: Path) -> str:
    data = bytearray((path / "data.bin").read_bytes())
    data[500] ^= 0x10
    (path / "data.bin").write_bytes(bytes(data))
    return "data.bin does not match its BLAKE3 hash"


def corrupt_truncated_manifest(path: Path) -> str:
    raw = (path / "manifest.json").read_bytes()
    (path / "manifest.json").write_bytes(raw[: len(raw) // 2])
    return "manifest.json is not valid JSON"


def corrupt_missing_file(path: Path) -> str:
    (path / "model.pt").unlink()
    return "model.pt is missing"


def corrupt_truncated_file(path: Path) -> str:
    (path / "model.pt").write_bytes((path / "model.pt").read_bytes()[:100])
    return "model.pt has 100 bytes"


def corrupt_edited_manifest(path: Path) -> str:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["data.bin"]["size"] = 999
    (path / "manifest.json").write_text(json.dumps(manifest))
    return "does not match its own BLAKE3"


def corrupt_no_manifest(path: Path) -> str:
    (path / "manifest.json").unlink()
    return "has no manifest.json"


@pytest.mark.parametrize(
    "corrupt",
    [
        corrupt_bitflip,
        corrupt_truncated_manifest,
        corrupt_missing_file,
        corrupt_truncated_file,
        corrupt_edited_manifest,
        corrupt_no_manifest,
    ],
)
def test_latest_falls_back_past_a_corrupt_checkpoint_with_a_warning(
    tmp_path: Path, corrupt: object
) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None)
    for s in (1, 2, 3):
        save_files(ckpt, s)
    problem = corrupt(tmp_path / "step_00000003")  # type: ignore[operator]
    with pytest.warns(UserWarning, match="step_00000003") as record:
        latest = Checkpointer(tmp_path).latest(verify="full")
    assert problem in str(record[0].message)
    assert latest is not None and latest.step == 2
    assert latest.load_file("model.pt")["step"] == 2
    if corrupt is corrupt_bitflip:
        # Sizes alone cannot see a flipped bit; the manifest is intact.
        assert Checkpointer(tmp_path).latest().step == 3  # type: ignore[union-attr]
    # A fresh run resumes from step 2 and may save step 3 again: it replaces the corrupt one.
    resumed = Checkpointer(tmp_path, keep_last=None)
    with pytest.warns(UserWarning):
        assert resumed.latest(verify="full").step == 2  # type: ignore[union-attr]
    save_files(resumed, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resumed.latest(verify="full").step == 3  # type: ignore[union-attr]
    assert not any(".old-" in n or ".tmp-" in n for n in entries(tmp_path))


def test_latest_of_an_empty_directory_is_none(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path).latest() is None
    assert Checkpointer(tmp_path).load() is None


# --- save_async -------------------------------------------------------------------------


class Gate:
    """Pickling it blocks until released: holds a background write at a known point."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __deepcopy__(self, memo: dict) -> Gate:
        return self

    def __reduce__(self) -> tuple:
        self.reached.set()
        assert self.release.wait(60)
        return (int, (0,))


def stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or 0)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


def test_save_async_blocks_only_for_the_copy_and_the_next_save_waits(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None)
    gate = Gate()
    weights = torch.randn(8 << 20)  # 32 MiB
    original = weights.clone()
    assert ckpt.save_async({"w": weights, "gate": gate}, 1)
    # It returned while the background thread is still writing the file.
    assert ckpt.pending
    assert gate.reached.wait(60)
    assert ckpt.committed_steps() == []
    weights.add_(1.0)  # the training loop changes the tensor at once

    seen: list[object] = []

    def next_save() -> None:
        with ckpt.save(2) as path:
            latest = ckpt.latest()
            seen.append(latest.step if latest else None)
            (path / "x").write_bytes(b"x")

    second = threading.Thread(target=next_save)
    second.start()
    wait_for(lambda: "_wait_async" in stack_of(second), 30, "the next save to wait")
    assert ckpt.committed_steps() == []
    gate.release.set()
    second.join(60)
    assert seen == [1], "the next save began before the background one was committed"
    state = Checkpointer(tmp_path).latest(verify="full")
    assert state is not None and state.step == 2
    loaded = torch.load(tmp_path / "step_00000001" / "model.pt", weights_only=False)
    assert torch.equal(loaded["w"], original) and loaded["gate"] == 0


def test_save_async_reuses_its_buffers_and_keeps_tied_tensors_tied(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None)
    weight = torch.zeros(1000)
    for step in range(3):
        weight.fill_(step)
        state = {"embed": weight, "head": weight, "bias": torch.full((7,), float(step))}
        assert ckpt.save_async(state, step)
        ckpt.wait()
    for step in range(3):
        state = torch.load(tmp_path / f"step_{step:08d}" / "model.pt")
        assert torch.equal(state["embed"], torch.full((1000,), float(step)))
        assert torch.equal(state["bias"], torch.full((7,), float(step)))
        ptr = state["embed"].untyped_storage().data_ptr()
        assert ptr == state["head"].untyped_storage().data_ptr()


def test_save_async_errors_surface_on_the_next_call_and_on_wait(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep_last=None)
    ckpt.save_async({"w": torch.ones(3)}, 1)
    ckpt.save_async({"w": torch.ones(3), "f": lambda: 0}, 2)  # cannot be pickled
    with pytest.raises(CheckpointError, match="background save of step 2 failed"):
        ckpt.save_async({"w": torch.ones(3)}, 3)
    assert ckpt.committed_steps() == [1]
    assert not any(".tmp-" in n for n in entries(tmp_path))
    assert ckpt.save_async({"w": torch.ones(3)}, 3)  # the error was raised once
    ckpt.save_async({"f": lambda: 0}, 4)
    with pytest.raises(CheckpointError, match="step 4"):
        ckpt.wait()
    ckpt.close()
    assert ckpt.committed_steps() == [1, 3]


# --- bad input ---------------------------------------------------------------------------


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown strategy 'sync'; use one of 'sync_any'"):
        Checkpointer(tmp_path, strategy="sync")
    with pytest.raises(ValueError, match=r"keep_last .* must be an int >= 1 or None, got 0"):
        Checkpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match=r'keep_best must be \(metric, "min" or "max"\)'):
        Checkpointer(tmp_path, keep_best=("loss", "lowest"))
    with pytest.raises(ValueError, match="keep_best must be"):
        Checkpointer(tmp_path, keep_best="loss")
    with pytest.raises(ValueError, match="keep_every must be an int >= 1"):
        Checkpointer(tmp_path, keep_every=-3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="exists and is not a directory"):
        Checkpointer(tmp_path / "file")
    with pytest.raises(ValueError, match="needs a store to agree across 2 ranks"):
        Checkpointer(tmp_path / "d", rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank 2 is not in a world of 2 ranks"):
        Checkpointer(tmp_path / "d", rank=2, world_size=2, strategy="async")

    ckpt = Checkpointer(tmp_path / "ok")
    with pytest.raises(ValueError, match="step must be >= 0, got -1"):
        ckpt.save(-1)
    with pytest.raises(TypeError, match="step must be an int"):
        ckpt.save(True)
    with pytest.raises(TypeError, match="metrics must be JSON-serializable"):
        ckpt.save(1, metrics={"x": object()})
    save_files(ckpt, 5)
    with pytest.raises(ValueError, match="step 5 is not after step 5, the last one saved"):
        save_files(ckpt, 5)
    with pytest.raises(ValueError, match="already holds a checkpoint of step 5"):
        save_files(Checkpointer(tmp_path / "ok"), 4)
    with pytest.raises(CheckpointError, match=r"manifest\.json is the checkpoint's own manifest"):
        with ckpt.save(6) as path:
            (path / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="name must be a relative file name"):
        ckpt.save_async({}, 7, name="../escape.pt")
    with pytest.raises(ValueError, match='verify must be "sizes" or "full"'):
        ckpt.latest(verify="hash")
    assert ckpt.committed_steps() == [5]


# --- a rank that died ----------------------------------------------------------------

FAILURE = "rank {dead} (node 0, local rank {dead}) exited with exit code 1"


@pytest.mark.parametrize("preempted", [False, True], ids=["running", "stop-requested"])
@pytest.mark.parametrize("stage", ["vote", "leave", "reports", "commit"])
def test_a_rank_waiting_for_a_dead_one_raises_once_the_launcher_marks_the_failure(
    tmp_path: Path,
    store: StoreProcess,
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    preempted: bool,
) -> None:
    """With timeout=600, a rank whose peer died in step 1 (at `stage`) raises within
    seconds of the launcher's `relaunch/RUN/workers/failed/ATTEMPT` key, naming the rank."""
    monkeypatch.setenv("RELAUNCH_RUN_ID", "job-dead-peer")
    monkeypatch.setenv("RELAUNCH_ATTEMPT", "4")
    if preempted:
        # A stop request alone changes nothing: step 0 still commits on both.
        monkeypatch.setitem(sys.modules, "relaunch.preemption", type(sys)("fake_preemption"))
        sys.modules["relaunch.preemption"].requested = lambda: True  # type: ignore[attr-defined]
        sys.modules["relaunch.preemption"].saved = lambda *args: None  # type: ignore[attr-defined]

    def connect() -> relaunch.Store:
        return relaunch.Store("127.0.0.1", store.port, timeout=30, prefix="")

    ckpts = [
        Checkpointer(tmp_path, store=connect(), rank=r, world_size=2, timeout=600, keep_last=None)
        for r in range(2)
    ]
    # Rank 0 waits for rank 1 in every stage but the last, where rank 1
    # waits for rank 0's commit.
    waiting, dead = (1, 0) if stage == "commit" else (0, 1)
    errors: dict[int, BaseException] = {}

    def save(rank: int, step: int) -> None:
        try:
            with ckpts[rank].save(step) as path:
                assert path is not None
                (path / f"rank{rank}.bin").write_bytes(b"x" * 100)
        except BaseException as e:
            errors[rank] = e

    def dies_after_getting_to(rank: int) -> None:
        """What `dead` did of step 1 before it died."""
        coordinator = ckpts[rank]._coordinator_()
        if stage == "vote":
            return
        coordinator.vote(1, True, False, "sync_any", ckpts[rank]._session)
        if stage in ("reports", "commit"):
            coordinator.leave_block(1, None)

    step0 = [threading.Thread(target=save, args=(r, 0)) for r in range(2)]
    for thread in step0:
        thread.start()
    for thread in step0:
        thread.join(30)
    assert not errors, errors
    assert Checkpointer(tmp_path).committed_steps() == [0]

    prefix = ckpts[0]._key_prefix
    control = connect()
    waiter = threading.Thread(target=save, args=(waiting, 1), daemon=True)
    corpse = threading.Thread(target=dies_after_getting_to, args=(dead,), daemon=True)
    waiter.start()
    corpse.start()
    corpse.join(30)
    assert not corpse.is_alive()
    blocked_on = {
        "vote": f"{prefix}1/ballots",
        "leave": f"{prefix}1/writers",
        "reports": f"{prefix}1/outcome",
        "commit": f"{prefix}1/report/1",
    }[stage]
    wait_for(lambda: control.check([blocked_on]), 30, f"rank {waiting} to reach {stage}")
    assert waiter.is_alive() and not errors

    failed_at = time.monotonic()
    control.set("relaunch/job-dead-peer/workers/failed/4", FAILURE.format(dead=dead))
    waiter.join(10)
    assert not waiter.is_alive(), "the waiting rank did not notice the failed peer"
    assert time.monotonic() - failed_at < 5
    error = errors[waiting]
    assert isinstance(error, CheckpointError), error
    assert FAILURE.format(dead=dead) in str(error)
    assert ("asked to stop" in str(error)) == preempted
    assert Checkpointer(tmp_path).committed_steps() == [0]
