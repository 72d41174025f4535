"""InterruptibleSampler against torch's DistributedSampler, through interruptions
at random points, world sizes that change between attempts, and real
DataLoaders with workers and prefetch."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler

from relaunch import InterruptibleSampler


class Indices(Dataset):
    """Sample ``i`` is ``i``, so a batch says which samples it holds."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def interleave(per_rank: Sequence[Sequence[int]]) -> list[int]:
    """The global order of samples that ranks consumed in lockstep: rank r's
    i-th sample sits at position i * world + r."""
    assert len({len(seq) for seq in per_rank}) <= 1, "ranks did not consume in lockstep"
    return [index for step in zip(*per_rank, strict=True) for index in step]


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """The uninterrupted epoch's global order, from torch's own sampler with two
    ranks (padding trimmed)."""
    ranks = []
    for rank in range(2):
        sampler = DistributedSampler(Indices(n), 2, rank, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
    return interleave(ranks)[:n]


def samplers(n: int, world: int, state: dict | None = None, **kwargs) -> list:
    out = []
    for rank in range(world):
        sampler = InterruptibleSampler(Indices(n), world, rank, **kwargs)
        if state is not None:
            sampler.load_state_dict(state)
        out.append(sampler)
    return out


def agreed_state(ranks: Sequence[InterruptibleSampler]) -> dict:
    """Rank 0's state, after checking that every rank computes the same."""
    states = [sampler.state_dict() for sampler in ranks]
    assert all(state == states[0] for state in states), states
    return states[0]


# (1) No interruption: DistributedSampler, index for index.


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_without_interruption_equals_distributed_sampler(shuffle: bool, drop_last: bool) -> None:
    for n in (0, 1, 2, 5, 10, 37, 100):
        for world in (1, 2, 3, 4, 7):
            for rank in range(world):
                theirs = DistributedSampler(Indices(n), world, rank, shuffle, 17, drop_last)
                ours = InterruptibleSampler(Indices(n), world, rank, shuffle, 17, drop_last)
                assert (len(ours), ours.num_samples, ours.total_size) == (
                    len(theirs),
                    theirs.num_samples,
                    theirs.total_size,
                )
                for epoch in (0, 1, 5):
                    theirs.set_epoch(epoch)
                    ours.set_epoch(epoch)
                    assert list(ours) == list(theirs), (n, world, rank, epoch)


def test_iterating_without_set_epoch_repeats_the_epoch_like_distributed_sampler() -> None:
    ours = InterruptibleSampler(Indices(11), 2, 1, seed=3)
    theirs = DistributedSampler(Indices(11), 2, 1, seed=3)
    assert list(ours) == list(theirs)
    assert list(ours) == list(theirs)
    assert ours.progress == 11


# (2) Interrupted at random points, world size 2 -> 3 -> 1.


@pytest.mark.parametrize("drop_last", [False, True])
def test_interrupted_epoch_with_changing_world_size_visits_each_sample_once_in_order(
    drop_last: bool,
) -> None:
    rng = random.Random(20240605)
    for _ in range(40):
        n, seed, epoch = rng.randint(1, 150), rng.randint(0, 1000), rng.randint(0, 9)
        state: dict | None = None
        consumed: list[int] = []
        for world in (2, 3, 1):
            ranks = samplers(n, world, state, seed=seed, drop_last=drop_last)
            for sampler in ranks:
                sampler.set_epoch(epoch)  # a resumed loop does this: keeps the progress
            share = len(ranks[0])
            if world == 1:
                steps = share
            elif drop_last:
                # Finishing a share with drop_last drops the epoch's tail, as
                # DistributedSampler does; stop before that.
                steps = rng.randint(0, max(share - 1, 0))
            else:
                steps = rng.randint(0, share)
            iterators = [iter(sampler) for sampler in ranks]
            per_rank = [[next(it) for _ in range(steps)] for it in iterators]
            before = state["progress"] if state else 0
            state = agreed_state(ranks)
            assert state["progress"] == (n if 0 < steps == share else before + steps * world)
            consumed += interleave(per_rank)[: state["progress"] - before]
        assert consumed == epoch_order(n, epoch, seed), (n, seed, epoch)
        assert sorted(consumed) == list(range(n))


# (2b) Resumed with the same world size: the same indices as uninterrupted, on
# every rank, padding included.


def resume_after(
    n: int, world: int, steps: int, relaunch_world: int | None = None, **kwargs
) -> list[list[int]]:
    """Each rank's indices for one epoch: `steps` from an uninterrupted sampler,
    then the rest from samplers of `relaunch_world` ranks that loaded its state."""
    ranks = samplers(n, world, **kwargs)
    for sampler in ranks:
        sampler.set_epoch(3)
    iterators = [iter(sampler) for sampler in ranks]
    before = [[next(it) for _ in range(steps)] for it in iterators]
    resumed = samplers(n, relaunch_world or world, agreed_state(ranks), **kwargs)
    after = [list(sampler) for sampler in resumed]
    if relaunch_world is None:
        return [head + tail for head, tail in zip(before, after, strict=True)]
    return after


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_resume_with_the_same_world_size_yields_what_an_uninterrupted_run_yields(
    world: int, drop_last: bool, shuffle: bool
) -> None:
    # Every remainder modulo the world size, small lengths (padding longer
    # than the dataset) and a large one; every resume point, including each
    # step inside the padded tail and the end.
    lengths = [*range(1, 3 * world + 2), 6145]
    for n in lengths:
        theirs = []
        for rank in range(world):
            sampler = DistributedSampler(Indices(n), world, rank, shuffle, 11, drop_last)
            sampler.set_epoch(3)
            theirs.append(list(sampler))
        share = len(theirs[0])
        points = range(share + 1) if share < 40 else (0, 1, share // 2, share - 2, share - 1, share)
        for steps in points:
            ours = resume_after(n, world, steps, shuffle=shuffle, seed=11, drop_last=drop_last)
            assert ours == theirs, (n, world, steps)


def test_resume_of_6145_samples_on_two_ranks_pads_like_an_uninterrupted_dataloader() -> None:
    # The reported case: rank 1's batch differed at the first padded step.
    n, batch = 6145, 32
    whole = take([iter(loader) for loader in loaders(samplers(n, 2, seed=7), 0, False)], None)
    for stopped in (1, 50, 95, 96):
        ranks = samplers(n, 2, seed=7)
        its = [iter(loader) for loader in loaders(ranks, 2, False, batch_size=batch)]
        head = take(its, stopped)
        del its
        resumed = samplers(n, 2, agreed_state(ranks), seed=7)
        tail = take([iter(loader) for loader in loaders(resumed, 0, False)], None)
        assert [h + t for h, t in zip(head, tail, strict=True)] == whole, stopped


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("world", "relaunch_world"), [(2, 3), (3, 2), (4, 8), (8, 3), (2, 1)])
def test_resume_with_another_world_size_deals_the_rest_and_pads_from_the_epoch_start(
    world: int, relaunch_world: int, shuffle: bool
) -> None:
    # The global order continues cyclically past its end, as DistributedSampler
    # pads: order[p:], then order[0], order[1], ...
    for n in range(1, 3 * max(world, relaunch_world) + 2):
        order = epoch_order(n, 3, 11, shuffle)
        share = -(-n // world)
        for steps in range(share):
            after = resume_after(n, world, steps, relaunch_world, shuffle=shuffle, seed=11)
            progress = steps * world
            dealt = interleave(after)
            assert len(dealt) == -(-(n - progress) // relaunch_world) * relaunch_world
            assert dealt == [order[i % n] for i in range(progress, progress + len(dealt))], (
                n,
                steps,
            )


def test_progress_of_a_finished_epoch_leaves_nothing_for_a_relaunch() -> None:
    (sampler,) = samplers(10, 1, seed=1)
    assert len(list(sampler)) == 10
    state = sampler.state_dict()
    assert state["progress"] == 10
    ranks = samplers(10, 3, state, seed=1)
    assert [len(s) for s in ranks] == [0, 0, 0]
    assert [list(s) for s in ranks] == [[], [], []]
    ranks[0].set_epoch(1)
    assert len(ranks[0]) == 4 and ranks[0].progress == 0


# (3) A new order every epoch, the same order for the same epoch and seed.


def test_reshuffles_every_epoch_and_repeats_for_the_same_epoch_and_seed() -> None:
    first, second = samplers(100, 2, seed=7)[0], samplers(100, 2, seed=7)[0]
    epoch0 = list(first)
    first.set_epoch(1)
    epoch1 = list(first)
    assert epoch0 != epoch1
    assert sorted(epoch0) != epoch0
    assert list(second) == epoch0
    second.set_epoch(1)
    assert list(second) == epoch1
    third = samplers(100, 2, seed=8)[0]
    assert list(third) != epoch0


# (4) What the training loop consumed, through real DataLoaders.


def loaders(ranks: Sequence[InterruptibleSampler], num_workers: int, persistent: bool, **kwargs):
    options = dict(batch_size=4, num_workers=num_workers, persistent_workers=persistent)
    if num_workers:
        options["prefetch_factor"] = 4
    options.update(kwargs)
    return [DataLoader(s.dataset, sampler=s, **options) for s in ranks]


def take(iterators: Sequence[Iterator], batches: int | None) -> list[list[int]]:
    """Each rank takes `batches` batches in lockstep (all of them if None)."""
    per_rank: list[list[int]] = [[] for _ in iterators]
    taken = 0
    while batches is None or taken < batches:
        try:
            got = [next(it) for it in iterators]
        except StopIteration:
            break
        for mine, batch in zip(per_rank, got, strict=True):
            mine += batch.tolist()
        taken += 1
    return per_rank


@pytest.mark.parametrize(
    ("num_workers", "persistent"),
    [(0, False), (2, False), (2, True)],
    ids=["main", "workers", "persistent"],
)
def test_dataloader_counts_the_batches_the_loop_received(
    num_workers: int, persistent: bool
) -> None:
    n, batch, seed = 103, 4, 5
    # Two ranks finish epoch 0, then stop in epoch 1 after 3 batches with
    # up to 8 more prefetched; their loaders are reused across epochs
    # (persistent workers reset rather than restart).
    ranks = samplers(n, 2, seed=seed)
    reused = loaders(ranks, num_workers, persistent)
    its = [iter(loader) for loader in reused]
    epoch0 = interleave(take(its, None))
    assert epoch0[:n] == epoch_order(n, 0, seed)
    assert agreed_state(ranks)["progress"] == n
    for sampler in ranks:
        sampler.set_epoch(1)
    its = [iter(loader) for loader in reused]
    consumed = interleave(take(its, 3))
    state = agreed_state(ranks)
    assert state["progress"] == 3 * batch * 2
    del its, reused

    # Three ranks, then one, resume epoch 1.
    for world, batches in ((3, 2), (1, None)):
        ranks = samplers(n, world, state, seed=seed)
        for sampler in ranks:
            sampler.set_epoch(state["epoch"])
        its = [iter(loader) for loader in loaders(ranks, num_workers, persistent)]
        per_rank = take(its, batches)
        before, state = state["progress"], agreed_state(ranks)
        consumed += interleave(per_rank)[: state["progress"] - before]
        del its
    assert state == {**state, "epoch": 1, "progress": n}
    assert consumed == epoch_order(n, 1, seed)


@pytest.mark.parametrize("persistent", [False, True])
def test_iterating_again_after_a_break_continues_after_the_last_batch_received(
    persistent: bool,
) -> None:
    (sampler,) = samplers(40, 1, seed=2)
    (loader,) = loaders([sampler], 2, persistent)
    whole = [i for b in loader for i in b.tolist()]
    assert list(sampler) == whole  # the finished epoch starts over
    sampler.set_epoch(0)
    got = []
    for step, b in enumerate(loader):
        got += b.tolist()
        if step == 2:
            break  # 8 more batches are prefetched by now
    assert sampler.progress == 12
    assert len(sampler) == 28
    got += [i for b in loader for i in b.tolist()]
    assert got == whole


def test_dataloader_without_batching_counts_samples() -> None:
    (sampler,) = samplers(30, 1, seed=4)
    (loader,) = loaders([sampler], 2, False, batch_size=None)
    it = iter(loader)
    first = [int(next(it)) for _ in range(7)]
    assert sampler.progress == 7
    del it
    (resumed,) = samplers(30, 1, sampler.state_dict(), seed=4)
    rest = [int(x) for x in loaders([resumed], 0, False, batch_size=None)[0]]
    assert first + rest == list(InterruptibleSampler(Indices(30), 1, 0, seed=4))


def test_dataloader_drop_last_completes_the_epoch_without_the_short_batch() -> None:
    ranks = samplers(23, 2, seed=1)  # 12 samples per rank: 2 batches of 5, 2 dropped
    its = [iter(loader) for loader in loaders(ranks, 2, False, batch_size=5, drop_last=True)]
    assert [len(x) for x in take(its, 1)] == [5, 5]
    assert agreed_state(ranks)["progress"] == 10
    take(its, None)
    assert agreed_state(ranks)["progress"] == 23


def test_advance_counts_like_cycling_utils() -> None:
    n, seed = 50, 9
    consumed: list[int] = []
    state = None
    for world, batches, auto_count in ((2, 3, False), (1, None, True)):
        ranks = samplers(n, world, state, seed=seed, auto_count=auto_count)
        its = [iter(loader) for loader in loaders(ranks, 2, False)]
        per_rank: list[list[int]] = [[] for _ in ranks]
        taken = 0
        while batches is None or taken < batches:
            try:
                got = [next(it) for it in its]
            except StopIteration:
                break
            for sampler, mine, b in zip(ranks, per_rank, got, strict=True):
                mine += b.tolist()
                # The auto-counting sampler switches to manual counting here,
                # so every batch counts once, not twice.
                sampler.advance(len(b))
            taken += 1
        before = state["progress"] if state else 0
        state = agreed_state(ranks)
        consumed += interleave(per_rank)[: state["progress"] - before]
        assert all(not s.auto_count for s in ranks)
    assert consumed == epoch_order(n, 0, seed)


class EvenFirst(BatchSampler):
    """A batch sampler of its own making: the sampler cannot count its batches."""

    def __iter__(self):
        indices = list(self.sampler)
        ordered = sorted(indices, key=lambda i: i % 2)
        for start in range(0, len(ordered), self.batch_size):
            yield ordered[start : start + self.batch_size]


def test_state_dict_refuses_what_it_cannot_count() -> None:
    (sampler,) = samplers(20, 1)
    loader = DataLoader(Indices(20), batch_sampler=EvenFirst(sampler, 4, False))
    next(iter(loader))
    with pytest.raises(ValueError, match=r"EvenFirst.*advance\(len\(batch\)\)"):
        sampler.state_dict()
    sampler.advance(4)
    assert sampler.state_dict()["progress"] == 4

    (sampler,) = samplers(20, 1)
    (loader,) = loaders([sampler], 2, False, in_order=False)
    next(iter(loader))
    with pytest.raises(ValueError, match="in_order=False"):
        sampler.state_dict()


# (5) Bad input.


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0}, "num_replicas must be at least 1, got 0"),
        ({"num_replicas": -2}, "num_replicas must be at least 1, got -2"),
        ({"rank": -1}, "rank must be at least 0, got -1"),
        ({"rank": 2}, r"rank=2 is out of range for num_replicas=2; rank must be in \[0, 1\]"),
        ({"num_replicas": 2.0}, "num_replicas must be an int, got 2.0"),
        ({"seed": None}, "seed must be an int, got None"),
        ({"seed": -1}, "seed must be at least 0, got -1"),
        ({"seed": 2**63}, "seed=.* is too large"),
        ({"shuffle": None}, "shuffle must be True or False, got None"),
        ({"drop_last": 1}, "drop_last must be True or False, got 1"),
        ({"dataset": None}, "needs a dataset with a length.*NoneType"),
        ({"dataset": iter(range(3))}, "needs a dataset with a length"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    arguments = {"dataset": Indices(10), "num_replicas": 2, "rank": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        InterruptibleSampler(**arguments)


def test_world_size_comes_from_the_process_group_or_must_be_given() -> None:
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=r"num_replicas=None .* not initialized"):
        InterruptibleSampler(Indices(10))
    with pytest.raises(ValueError, match=r"rank=None .* not initialized"):
        InterruptibleSampler(Indices(10), num_replicas=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sampler = InterruptibleSampler(Indices(10))
        assert (sampler.num_replicas, sampler.rank) == (1, 0)
    finally:
        dist.destroy_process_group()


def test_bad_epochs_and_advances_are_refused() -> None:
    sampler = InterruptibleSampler(Indices(10), 2, 0)
    for epoch, message in ((-1, "at least 0"), (None, "must be an int"), (2**63, "too large")):
        with pytest.raises(ValueError, match=message):
            sampler.set_epoch(epoch)
    with pytest.raises(ValueError, match="n must be at least 0"):
        sampler.advance(-1)
    sampler.advance(4)
    with pytest.raises(ValueError, match=r"advance\(2\) goes past .* 4 of 5 samples"):
        sampler.advance(2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"dataset": Indices(11)},
            "saved for a dataset of 10 samples, this dataset has 11.*same dataset",
        ),
        ({"seed": 4}, "saved with seed=3, this sampler has seed=4.*with seed=3 to resume"),
        (
            {"shuffle": False},
            "saved with shuffle=True, this sampler has shuffle=False.*with shuffle=True",
        ),
    ],
)
def test_load_refuses_state_of_another_order(change: dict, message: str) -> None:
    saved = InterruptibleSampler(Indices(10), 2, 0, seed=3)
    saved.advance(2)
    arguments = {"dataset": Indices(10), "num_replicas": 2, "rank": 0, "seed": 3, **change}
    sampler = InterruptibleSampler(**arguments)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(saved.state_dict())
    assert sampler.progress == 0  # nothing was loaded


def test_load_accepts_another_drop_last_and_world_size() -> None:
    saved = InterruptibleSampler(Indices(10), 2, 0, drop_last=False)
    saved.advance(2)
    sampler = InterruptibleSampler(Indices(10), 3, 2, drop_last=True)
    sampler.load_state_dict(saved.state_dict())
    assert (sampler.progress, len(sampler)) == (4, 2)


def good_state() -> dict:
    sampler = InterruptibleSampler(Indices(10), 2, 0)
    sampler.advance(1)
    return sampler.state_dict()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (None, "must be the dict .* got NoneType"),
        ([("epoch", 0)], "must be the dict .* got list"),
        ({}, "missing 'format', 'epoch', .* has nothing"),
        ({"epoch": 1, "progress": 3}, "cycling_utils"),
        ({k: v for k, v in good_state().items() if k != "seed"}, "missing 'seed'.*cut short"),
        ({**good_state(), "progress": -1}, "corrupt: 'progress' must be a non-negative int"),
        ({**good_state(), "progress": "2"}, "corrupt: 'progress' must be a non-negative int"),
        ({**good_state(), "progress": 11}, "progress 11 is beyond the dataset length 10"),
        ({**good_state(), "epoch": True}, "corrupt: 'epoch' must be a non-negative int"),
        ({**good_state(), "epoch": 2**63}, "corrupt: epoch .* beyond 2\\*\\*63"),
        ({**good_state(), "shuffle": 1}, "corrupt: 'shuffle' must be True or False"),
        ({**good_state(), "format": 2}, "format 2, this version of relaunch reads format 1"),
    ],
)
def test_load_refuses_corrupt_or_partial_state(state: object, message: str) -> None:
    sampler = InterruptibleSampler(Indices(10), 2, 0)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)  # type: ignore[arg-type]


# (6) Through torch.save and torch.load.


def test_state_round_trips_through_torch_save_with_weights_only() -> None:
    ranks = samplers(25, 2, seed=6)
    for sampler in ranks:
        sampler.set_epoch(3)
    for it in [iter(s) for s in ranks]:
        for _ in range(4):
            next(it)
    state = agreed_state(ranks)
    assert all(type(v) in (int, bool) for v in state.values()), state
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded == state
    resumed = InterruptibleSampler(Indices(25), 1, 0, seed=6)
    resumed.load_state_dict(loaded)
    assert (resumed.epoch, resumed.progress, resumed.state_dict()["num_replicas"]) == (3, 8, 1)


def test_import_relaunch_does_not_import_torch() -> None:
    code = "import sys, relaunch; assert 'torch' not in sys.modules; relaunch.InterruptibleSampler"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
