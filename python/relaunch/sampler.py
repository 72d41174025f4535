"""A ``DistributedSampler`` that resumes exactly where training stopped, even
when the world size changed in between.

Order and progress
------------------

Epoch ``e`` has one *global order*: ``torch.randperm(len(dataset))`` drawn
from a ``torch.Generator`` seeded with ``seed + e`` (``range(len(dataset))``
without shuffling), exactly as ``DistributedSampler`` draws it. *Progress*
``p`` means that the prefix ``order[:p]`` has been consumed by the ranks
together. An iteration deals the rest, ``order[p:]``, round-robin to the
current ranks: rank ``r`` of ``W`` gets ``rest[r], rest[r + W], ...``; without
``drop_last`` the rest is padded until it divides evenly by continuing the
order from its start (``order[0], order[1], ...``, as ``DistributedSampler``
pads), with ``drop_last`` its tail is cut instead. From ``p = 0`` that is
``DistributedSampler``'s split, index for index, and a resume with the same
world size yields on every rank what an uninterrupted run yields, padding
included.

Ranks consume in lockstep (each rank has taken ``k`` samples at a
synchronized step), so at any such step the consumed samples are exactly the
prefix ``order[:p + k * W]``, and :meth:`InterruptibleSampler.state_dict`
records that number (capped at the dataset length; once a rank has consumed
all it will get, the epoch is complete and progress is the dataset length).
A relaunch with any world size loads it and deals ``order[p:]`` to its own
ranks, so every sample is seen once per epoch and the global order equals
that of an uninterrupted run. Every rank computes the same state at a
synchronized step; saving rank 0's is enough.

Counting what the training loop consumed
----------------------------------------

A DataLoader pulls indices ahead of the loop: its main process hands
``prefetch_factor * num_workers`` batches to workers before the loop has
seen the first. Counting indices handed out would skip data on resume.
The sampler counts batches the DataLoader has *returned to the loop*.

When an iteration starts, the sampler finds the DataLoader iterator that is
pulling from it (a few frames up the call stack: ``_next_index``) and
replaces that iterator's ``_num_yielded`` (the number of batches it
returned, which it increments after each batch and zeroes on reset) with an
``int`` subclass that reports each increment to the sampler. Consumed
samples on this rank are then ``batches * batch_size`` (the DataLoader's
``BatchSampler`` takes consecutive indices, so the last batch holds what is
left). The count is pushed, not read later, so it survives the iterator
being dropped or reset (persistent workers). Sampling without a DataLoader
counts the indices handed out, which is what a plain loop consumes.

Limits: a wrapper that pulls batches from the DataLoader ahead of the loop
(a device prefetcher, accelerate's ``DataLoaderShard``, Lightning's
prefetching fetcher) is counted when it pulls; a batch sampler other than
torch's ``BatchSampler`` cannot be counted; ``DataLoader(in_order=False)``
returns batches out of order, so what was consumed is not a prefix. The
first two need manual counting (``auto_count=False`` and :meth:`advance`);
:meth:`state_dict` refuses, with a message saying so, rather than record a
wrong number.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DistributedSampler

__all__ = ["InterruptibleSampler"]

# Bumped when the meaning of a field changes; load_state_dict refuses others.
_FORMAT = 1

# torch seeds with `seed + epoch`, which must stay below 2**64.
_SEED_LIMIT = 2**63

# How far up the call stack an iteration looks for the DataLoader iterator
# pulling from it. torch's is two frames up (BatchSampler, then
# `_next_index`); the margin allows for a wrapping batch sampler.
_SEARCH_DEPTH = 6


class _Pass:
    """One iteration over the sampler and what the training loop took from it."""

    __slots__ = (
        "base",
        "batch_size",
        "count_problem",
        "deliverable",
        "delivered",
        "order_problem",
        "pulled",
        "share",
        "start",
    )

    def __init__(self, base: int, share: int) -> None:
        self.base = base  # global progress when the pass began
        self.share = share  # indices this rank gets in this pass
        self.deliverable = share  # of those, what the DataLoader returns
        self.pulled = 0  # indices handed out
        self.batch_size: int | None = None  # set when a DataLoader is counting
        self.start = 0  # the DataLoader's batch count when the pass began
        self.delivered = 0  # batches the DataLoader returned since
        self.count_problem: str | None = None
        self.order_problem: str | None = None

    def consumed(self) -> int:
        if self.batch_size is None:
            return self.pulled
        return min(self.delivered * self.batch_size, self.share)


class _DeliveryCount(int):
    """Stands in for a DataLoader iterator's ``_num_yielded``: ``+= 1`` after
    each batch returned to the loop reports the new count to the pass."""

    def __new__(cls, value: int, pass_: _Pass) -> _DeliveryCount:
        count = super().__new__(cls, value)
        count.pass_ = pass_
        return count

    def __add__(self, other: Any) -> Any:
        total = int.__add__(self, other)
        if total is NotImplemented:
            return total
        self.pass_.delivered = total - self.pass_.start
        return _DeliveryCount(total, self.pass_)


class InterruptibleSampler(DistributedSampler[int]):
    """``DistributedSampler`` with a resumable ``state_dict()``.

    Same arguments and, for an epoch that starts from scratch, the same
    indices on every rank. ``state_dict()`` records how much of the epoch's
    global order all ranks together have consumed; ``load_state_dict()`` in
    a relaunch, with the same or another world size, continues with the rest
    of that order. Consumption is counted from the batches the DataLoader
    returns to the training loop, workers and prefetch included (see the
    module documentation for how, and for the limits).

    ``auto_count=False`` turns that off: then only :meth:`advance` counts, as
    with cycling_utils' ``InterruptableDistributedSampler``. Calling
    :meth:`advance` on a sampler that counts automatically switches it to
    manual counting for good, so code written against cycling_utils, which
    calls ``advance(len(batch))`` after every batch, counts each batch once.

    Iterating again over an epoch continues from its progress; an iteration
    that reached the end of the epoch ends it, and the next one over the same
    epoch starts it over with the same order (as ``DistributedSampler`` does
    when ``set_epoch`` is not called). A resumed loop should therefore start
    at ``sampler.epoch``: ``set_epoch`` with the current epoch keeps the
    progress, any other epoch starts that epoch from its beginning.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        auto_count: bool = True,
    ) -> None:
        try:
            dataset_len = len(dataset)
        except TypeError:
            raise ValueError(
                f"InterruptibleSampler needs a dataset with a length (a map-style dataset); "
                f"{type(dataset).__name__} has none"
            ) from None
        if num_replicas is None:
            num_replicas = _from_process_group("num_replicas", dist.get_world_size)
        if rank is None:
            rank = _from_process_group("rank", dist.get_rank)
        _require_int("num_replicas", num_replicas, minimum=1)
        _require_int("rank", rank, minimum=0)
        if rank >= num_replicas:
            raise ValueError(
                f"rank={rank} is out of range for num_replicas={num_replicas}; "
                f"rank must be in [0, {num_replicas - 1}]"
            )
        _require_bool("shuffle", shuffle)
        _require_int("seed", seed, minimum=0)
        if seed >= _SEED_LIMIT:
            raise ValueError(f"seed={seed} is too large; it must be below 2**63")
        _require_bool("drop_last", drop_last)
        _require_bool("auto_count", auto_count)

        self.dataset = dataset
        self._dataset_len = dataset_len
        self._num_replicas = num_replicas
        self._rank = rank
        self._shuffle = shuffle
        self._seed = seed
        self._drop_last = drop_last
        self.auto_count = auto_count
        self._epoch = 0
        # The current segment of the epoch: it began at global progress
        # `_base`, with the iteration `_pass` (None until one starts) and
        # `_advanced` samples of this rank reported through advance().
        self._base = 0
        self._pass: _Pass | None = None
        self._advanced = 0

    # -- DistributedSampler's attributes -----------------------------------

    @property
    def num_replicas(self) -> int:
        return self._num_replicas

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def drop_last(self) -> bool:
        return self._drop_last

    @property
    def epoch(self) -> int:
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    @property
    def num_samples(self) -> int:
        """Indices the next iteration yields on this rank (``len(self)``)."""
        return len(self)

    @property
    def total_size(self) -> int:
        """Indices the next iteration yields on all ranks, padding included."""
        return len(self) * self._num_replicas

    @property
    def progress(self) -> int:
        """Samples of this epoch's global order consumed by all ranks together."""
        return self._progress()

    # -- the sampler protocol ----------------------------------------------

    def __len__(self) -> int:
        """Indices the next iteration yields on this rank: ``DistributedSampler``'s
        ``num_samples`` for a fresh epoch, this rank's share of what is left
        after :meth:`load_state_dict` or an interrupted iteration."""
        return self._share(self._next_base())

    def __iter__(self) -> Iterator[int]:
        # A generator: nothing happens until the first index is asked for,
        # and then the caller is the one that will consume the indices.
        pass_ = self._begin_pass(sys._getframe(1))
        for index in self._indices(pass_.base, pass_.share):
            pass_.pulled += 1
            yield index

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, or keep the progress if it is the
        current epoch (so a resumed loop can call it with ``sampler.epoch``)."""
        _require_int("epoch", epoch, minimum=0)
        if epoch >= _SEED_LIMIT:
            raise ValueError(f"epoch={epoch} is too large; it must be below 2**63")
        if epoch != self._epoch:
            self._epoch = epoch
            self._start_segment(0)

    @contextlib.contextmanager
    def in_epoch(self, epoch: int) -> Iterator[InterruptibleSampler]:
        """``with sampler.in_epoch(epoch):`` as in cycling_utils; same as
        ``set_epoch(epoch)``."""
        self.set_epoch(epoch)
        yield self

    def advance(self, n: int) -> None:
        """Record that this rank consumed ``n`` more samples, and count only
        this way from now on (see the class documentation)."""
        _require_int("n", n, minimum=0)
        if self.auto_count:
            self.auto_count = False
            self._advanced = 0
        share = self._pass.share if self._pass is not None else self._share(self._base)
        if self._advanced + n > share:
            raise ValueError(
                f"advance({n}) goes past the end of this rank's share of the epoch: "
                f"{self._advanced} of {share} samples are already consumed"
            )
        self._advanced += n

    # -- state ---------------------------------------------------------------

    def state_dict(self) -> dict[str, int | bool]:
        """The epoch and its global progress, plus what the order depends on.

        Plain ints and bools, so ``torch.save``/``torch.load(weights_only=True)``
        and JSON carry it as is. ``num_replicas`` is the saving world size, for
        information only; a different one may load it.
        """
        pass_ = self._pass
        if pass_ is not None and pass_.order_problem:
            raise ValueError(pass_.order_problem)
        if pass_ is not None and self.auto_count and pass_.count_problem:
            raise ValueError(pass_.count_problem)
        return {
            "format": _FORMAT,
            "epoch": self._epoch,
            "progress": self._progress(),
            "dataset_len": self._dataset_len,
            "seed": self._seed,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
            "num_replicas": self._num_replicas,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the saved epoch with the rest of its global order, split
        across this sampler's ranks. The dataset length, seed and shuffle must
        match those that saved it; ``drop_last`` and the world size may differ."""
        fields = _parse_state(state)
        for name, ours in (
            ("dataset_len", self._dataset_len),
            ("seed", self._seed),
            ("shuffle", self._shuffle),
        ):
            if fields[name] != ours:
                raise ValueError(_mismatch(name, fields[name], ours))
        self._epoch = fields["epoch"]
        self._start_segment(fields["progress"])

    # -- internals -----------------------------------------------------------

    def _start_segment(self, base: int) -> None:
        self._base = base
        self._pass = None
        self._advanced = 0

    def _share(self, base: int) -> int:
        rest = self._dataset_len - base
        if self._drop_last:
            return rest // self._num_replicas
        return -(-rest // self._num_replicas)

    def _progress(self) -> int:
        pass_ = self._pass
        consumed = pass_.consumed() if self.auto_count and pass_ is not None else self._advanced
        if pass_ is None and consumed == 0:
            return self._base
        deliverable = pass_.deliverable if pass_ is not None else self._share(self._base)
        if consumed >= deliverable:
            return self._dataset_len
        return min(self._base + consumed * self._num_replicas, self._dataset_len)

    def _next_base(self) -> int:
        progress = self._progress()
        ran_here = self._pass is not None or self._advanced > 0
        if progress == self._dataset_len and ran_here:
            return 0  # the epoch ended in this process: start it over
        return progress

    def _begin_pass(self, caller: Any) -> _Pass:
        base = self._next_base()
        pass_ = _Pass(base, self._share(base))
        self._start_segment(base)
        self._pass = pass_
        loader_iter = _find_loader_iter(self, caller)
        if loader_iter is not None:
            _attach(self, loader_iter, pass_)
        return pass_

    def _indices(self, base: int, share: int) -> list[int]:
        if share == 0:
            return []
        # Position j of this rank is order[(base + rank + j * W) % len(order)]:
        # the round-robin deal of the rest, continued past the end of the
        # order from its start. That wrap-around is DistributedSampler's
        # padding, so a resumed epoch pads with the same samples as an
        # uninterrupted one (drop_last shares never reach it).
        steps = torch.arange(share, dtype=torch.int64) * self._num_replicas
        positions = (steps + base + self._rank) % self._dataset_len
        if not self._shuffle:
            return positions.tolist()
        generator = torch.Generator()
        generator.manual_seed(self._seed + self._epoch)
        order = torch.randperm(self._dataset_len, generator=generator)
        return order[positions].tolist()


def _find_loader_iter(sampler: InterruptibleSampler, frame: Any) -> Any:
    """The DataLoader iterator among the callers that started an iteration."""
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if (
            candidate is not None
            and candidate is not sampler
            and hasattr(candidate, "_num_yielded")
            and hasattr(candidate, "_index_sampler")
        ):
            return candidate
        frame = frame.f_back
    return None


def _attach(sampler: InterruptibleSampler, loader_iter: Any, pass_: _Pass) -> None:
    """Make ``loader_iter`` report to ``pass_`` each batch it returns."""
    if not getattr(loader_iter, "_in_order", True):
        pass_.order_problem = (
            "the DataLoader was built with in_order=False, so it returns batches out of "
            "order and the samples consumed are not a prefix of the epoch: resume would "
            "be inexact; build it with in_order=True (the default)"
        )
    index_sampler = loader_iter._index_sampler
    if index_sampler is sampler:
        batch_size, drops_last = 1, False
    elif (
        isinstance(index_sampler, BatchSampler)
        and type(index_sampler).__iter__ is BatchSampler.__iter__
        and index_sampler.sampler is sampler
    ):
        batch_size, drops_last = index_sampler.batch_size, index_sampler.drop_last
    else:
        pass_.count_problem = (
            f"the DataLoader forms batches with {type(index_sampler).__name__}, so the "
            "sampler cannot tell how many samples each batch it returns holds; call "
            "sampler.advance(len(batch)) after each batch (or pass auto_count=False "
            "and do so)"
        )
        return
    count = loader_iter._num_yielded
    if not isinstance(count, int):
        pass_.count_problem = (
            f"this version of torch ({torch.__version__}) counts DataLoader batches in a "
            "way the sampler does not know; call sampler.advance(len(batch)) after each "
            "batch, with auto_count=False"
        )
        return
    pass_.batch_size = batch_size
    if drops_last:
        pass_.deliverable = pass_.share // batch_size * batch_size
    pass_.start = int(count)
    loader_iter._num_yielded = _DeliveryCount(int(count), pass_)


def _from_process_group(name: str, get: Any) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"{name}=None takes it from torch.distributed, whose process group is not "
            f"initialized; call torch.distributed.init_process_group() first or pass "
            f"{name}= explicitly"
        )
    return get()


def _require_int(name: str, value: Any, *, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def _require_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


_STATE_INTS = ("format", "epoch", "progress", "dataset_len", "seed", "num_replicas")
_STATE_BOOLS = ("shuffle", "drop_last")


def _parse_state(state: Any) -> dict[str, Any]:
    """The fields of a ``state_dict()``, checked; a clear error for anything else."""
    if not isinstance(state, Mapping):
        raise ValueError(
            f"sampler state must be the dict that InterruptibleSampler.state_dict() "
            f"returned, got {type(state).__name__}"
        )
    if set(state) == {"epoch", "progress"}:
        raise ValueError(
            "sampler state has only 'epoch' and 'progress': it looks like the state of "
            "cycling_utils' InterruptableDistributedSampler, whose progress counts one "
            "rank's samples; InterruptibleSampler cannot resume from it exactly, start "
            "the epoch again with set_epoch() instead"
        )
    missing = [key for key in (*_STATE_INTS, *_STATE_BOOLS) if key not in state]
    if missing:
        raise ValueError(
            f"sampler state is missing {', '.join(map(repr, missing))} (it has "
            f"{', '.join(map(repr, sorted(map(str, state)))) or 'nothing'}): it was not "
            f"made by InterruptibleSampler.state_dict() or was cut short"
        )
    for key in _STATE_INTS:
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(
                f"sampler state is corrupt: {key!r} must be a non-negative int, got {value!r}"
            )
    for key in _STATE_BOOLS:
        if not isinstance(state[key], bool):
            raise ValueError(
                f"sampler state is corrupt: {key!r} must be True or False, got {state[key]!r}"
            )
    if state["format"] != _FORMAT:
        raise ValueError(
            f"sampler state has format {state['format']}, this version of relaunch reads "
            f"format {_FORMAT}; resume with the relaunch version that saved it"
        )
    if state["epoch"] >= _SEED_LIMIT:
        raise ValueError(f"sampler state is corrupt: epoch {state['epoch']} is beyond 2**63")
    if state["progress"] > state["dataset_len"]:
        raise ValueError(
            f"sampler state is corrupt: progress {state['progress']} is beyond the "
            f"dataset length {state['dataset_len']}"
        )
    return dict(state)


def _mismatch(name: str, saved: Any, ours: Any) -> str:
    if name == "dataset_len":
        return (
            f"sampler state was saved for a dataset of {saved} samples, this dataset has "
            f"{ours}: the epoch's order depends on the length, so its progress cannot be "
            "resumed; resume with the same dataset, or skip load_state_dict() and start "
            "the epoch over"
        )
    return (
        f"sampler state was saved with {name}={saved}, this sampler has {name}={ours}: "
        f"the epoch's order depends on it; construct the sampler with {name}={saved} to "
        "resume"
    )
