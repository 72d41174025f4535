"""cycling_utils' samplers (``cycling_utils.sampler``), the first two on
:class:`relaunch.InterruptibleSampler`.

The calls are cycling_utils': ``advance(n)`` after each batch (``n``: the
samples this rank consumed), ``state_dict()``/``load_state_dict()``,
``set_epoch(epoch)`` (refused while the epoch's progress is not reset),
``reset_progress()`` at the end of an epoch, ``with in_epoch(epoch):``,
``progress`` (samples this rank consumed in the epoch) and ``len()`` (this
rank's samples in a whole epoch, so ``len(loader)`` counts the epoch's
batches and ``enumerate(loader, start=progress // batch_size)`` numbers a
resumed epoch's batches as an uninterrupted one would).

State: ``state_dict()`` is cycling_utils' ``{"progress", "epoch"}``, with
``progress`` in its meaning (samples this rank consumed), plus relaunch's
fields: ``global_progress`` (the prefix of the epoch's global order that
all ranks consumed), ``num_replicas``, ``dataset_len``, ``seed``,
``shuffle``, ``drop_last``, ``order_epoch`` and ``format``. So:

- cycling_utils loads it and reads the two fields it knows: with the world
  size that saved it, in epoch 0, without shuffling, or in an epoch that
  continued a cycling_utils state (below), it goes on with exactly the
  samples not yet seen; in a later epoch of a shuffled run it goes on in
  its own order (one shuffle for every epoch), so the rest of that epoch
  repeats some samples and leaves out others; from the next epoch on it
  samples as it always does.
- this sampler loads a state cycling_utils saved (``{"progress", "epoch"}``
  only, read as saved by the current world size, with a warning, since it
  does not say) and finishes that epoch exactly: in cycling_utils' order
  (the permutation of ``seed``) and at its position; the epochs after it
  are shuffled anew.

What differs, on purpose:

- **Every epoch is shuffled anew** (``seed + epoch``, as
  ``DistributedSampler``). cycling_utils 0.0.3's
  ``InterruptableDistributedSampler`` draws one order at construction and
  keeps it for every epoch (its ``InterruptableSampler`` reshuffles, as
  this one does).
- **A resume with another world size continues exactly**: every sample is
  seen once per epoch. cycling_utils records a per-rank count only, so
  shrinking the job replays samples and growing it skips some, or raises
  ``AdvancedTooFarError``.
- **reset_progress() ends the epoch**: the next epoch (``epoch + 1``) is
  current afterwards, so a checkpoint taken between ``reset_progress()`` and
  the next ``set_epoch`` resumes at the next epoch; cycling_utils replays the
  finished one.
- ``set_epoch`` with the current epoch keeps its progress (cycling_utils
  raises after an ``advance``; a resumed loop calls it with
  ``sampler.epoch``), and another epoch starts from its beginning.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DistributedSampler

from relaunch.sampler import InterruptibleSampler as _RelaunchSampler

__all__ = [
    "AdvancedTooFarError",
    "HasNotResetProgressError",
    "InterruptableDistributedGroupedBatchSampler",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
]


class AdvancedTooFarError(ValueError):
    """``advance`` (or a loaded state) went past this rank's share of the epoch."""


class HasNotResetProgressError(RuntimeError):
    """``set_epoch`` to another epoch while this one's progress was not reset."""


def _count(state: Mapping[str, Any], name: str) -> int:
    value = state[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"state[{name!r}] must be an int >= 0, got {value!r}")
    return value


def _not_reset(epoch: int, current: int, progress: int) -> HasNotResetProgressError:
    return HasNotResetProgressError(
        f"set_epoch({epoch}) while epoch {current} has progress {progress}: "
        "call reset_progress() when an epoch ends (or use `with sampler.in_epoch(e):`)"
    )


class InterruptableDistributedSampler(_RelaunchSampler):
    """cycling_utils' ``InterruptableDistributedSampler``: same arguments
    (``num_replicas``/``rank`` default to torch.distributed's), counted by
    :meth:`advance` only."""

    # Whether cycling_utils' class of this name draws one order for every
    # epoch (its state then continues in the order of epoch 0).
    _ONE_ORDER = True

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        # As torch's samplers: any truthy shuffle/drop_last, True and False as seeds.
        seed = int(seed) if isinstance(seed, bool) else seed
        shuffle, drop_last = bool(shuffle), bool(drop_last)
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last, auto_count=False)
        # Whether advance() ran since the epoch began or was reset.
        self._dirty = False
        # The epoch whose order the current epoch follows, when not its own
        # (the rest of an epoch begun by cycling_utils).
        self._order_epoch: int | None = None

    @property
    def progress(self) -> int:  # type: ignore[override]
        """Samples this rank consumed in the current epoch (cycling_utils' meaning)."""
        consumed = self._progress()
        if consumed >= self._dataset_len:
            return self._share(0)  # the whole epoch
        return consumed // self.num_replicas

    def __len__(self) -> int:
        """This rank's samples in a whole epoch, as cycling_utils counts them."""
        return self._share(0)

    def advance(self, n: int) -> None:
        try:
            super().advance(n)
        except ValueError as e:
            if "goes past the end" in str(e):
                raise AdvancedTooFarError(str(e)) from None
            raise
        self._dirty = True

    def set_epoch(self, epoch: int) -> None:
        if self._dirty and epoch != self.epoch:
            raise _not_reset(epoch, self.epoch, self.progress)
        if epoch != self.epoch:
            self._order_epoch = None
        super().set_epoch(epoch)

    def reset_progress(self) -> None:
        """End the current epoch: the next one starts from its beginning, and a
        checkpoint taken now resumes there."""
        self._dirty = False
        self._order_epoch = None
        super().set_epoch(self.epoch + 1)

    _reset_progress = reset_progress

    @contextlib.contextmanager
    def in_epoch(self, epoch: int) -> Iterator[InterruptableDistributedSampler]:  # type: ignore[override]
        """``set_epoch(epoch)``, the block, then ``reset_progress()``; an
        exception leaves the progress as it was (for a checkpoint)."""
        self.set_epoch(epoch)
        yield self
        self.reset_progress()

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        ours = super().state_dict()
        state: dict[str, Any] = {"progress": self.progress, "epoch": ours.pop("epoch")}
        state["global_progress"] = ours.pop("progress")
        state.update(ours)
        state["order_epoch"] = self.epoch if self._order_epoch is None else self._order_epoch
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # type: ignore[override]
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), not {type(state).__name__}")
        if "format" in state:  # this sampler's, or relaunch.InterruptibleSampler's
            ours = dict(state)
            if "global_progress" in ours:
                ours["progress"] = ours.pop("global_progress")
            order_epoch = ours.pop("order_epoch", ours.get("epoch"))
            super().load_state_dict(ours)
            if isinstance(order_epoch, bool) or not isinstance(order_epoch, int) or order_epoch < 0:
                raise ValueError(f"state['order_epoch'] must be an int >= 0, got {order_epoch!r}")
        elif "progress" in state and "epoch" in state:
            ours, order_epoch = self._from_cycling_utils(state)
            super().load_state_dict(ours)
        else:
            super().load_state_dict(state)  # says what is missing
            order_epoch = self.epoch
        self._order_epoch = order_epoch if order_epoch != self.epoch and self.shuffle else None
        self._dirty = False

    def _from_cycling_utils(self, state: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
        progress, epoch = _count(state, "progress"), _count(state, "epoch")
        if progress > self._share(0):
            raise AdvancedTooFarError(
                f"state['progress']={progress} is past this rank's {self._share(0)} samples of "
                f"an epoch with {self.num_replicas} rank(s): it was saved by fewer ranks"
            )
        warnings.warn(
            "loading a cycling_utils sampler state, which does not record its world size: "
            f"read as saved by {self.num_replicas} rank(s), as now. Save again with this "
            "sampler and later resumes may change the world size.",
            stacklevel=3,
        )
        ours = _RelaunchSampler.state_dict(self)
        # Every rank took `progress` of its share, in lockstep: the first
        # progress * num_replicas of the epoch's order.
        ours.update(epoch=epoch, progress=min(progress * self.num_replicas, self._dataset_len))
        return ours, 0 if self._ONE_ORDER else epoch

    def _indices(self, base: int, share: int) -> list[int]:
        if self._order_epoch is None:
            return super()._indices(base, share)
        epoch, self._epoch = self._epoch, self._order_epoch
        try:
            return super()._indices(base, share)
        finally:
            self._epoch = epoch


class InterruptableSampler(InterruptableDistributedSampler):
    """cycling_utils' ``InterruptableSampler``: one process's whole dataset
    (a :class:`DistributedShardedDataset` shard, say), in order or shuffled
    anew each epoch; ``num_replicas``, ``rank`` and ``drop_last`` are
    accepted and ignored, as there."""

    _ONE_ORDER = False

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed)


class InterruptableDistributedGroupedBatchSampler(DistributedSampler):
    """cycling_utils' ``InterruptableDistributedGroupedBatchSampler``: a batch
    sampler (``DataLoader(dataset, batch_sampler=sampler)``) whose batches
    each hold samples of one group (``group_ids[i]``: sample ``i``'s group,
    e.g. its aspect ratio bucket, as torchvision's detection reference does).

    As there: each rank takes ``DistributedSampler``'s indices for the epoch
    and fills one buffer per group in that order; a full buffer is a batch.
    The ``ceil(num_samples / batch_size)`` batches are completed from the
    fullest buffers left (ties: the group whose buffer began first), each
    topped up with the group's first samples on this rank, again if need be.
    Progress counts batches: ``advance()`` (no argument) after each;
    ``with sampler.in_epoch(epoch):`` (``set_epoch`` raises, as there).

    What differs: ``reset_progress()`` (the end of ``in_epoch``) moves to the
    next epoch, as the other samplers here; ``in_epoch`` with another epoch
    than the current one starts it from its first batch and is refused after
    an ``advance()`` that was not reset; ``len()`` and ``load_state_dict``
    work before the first ``in_epoch``; ``state_dict()`` adds
    ``num_replicas``, and a state saved by another world size restarts its
    epoch with a warning (each rank's batches depend on the world size;
    cycling_utils would skip or repeat batches).
    """

    def __init__(
        self,
        dataset: Any,
        group_ids: Any,
        batch_size: int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        groups = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
        if len(groups) != len(dataset):
            raise ValueError(
                f"group_ids has {len(groups)} entries for a dataset of {len(dataset)} samples: "
                "give one group id per sample"
            )
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last)
        self.group_ids = groups
        self.batch_size = batch_size
        self.progress = 0
        self.num_batches = math.ceil(self.num_samples / batch_size)
        self._dirty = False
        self._made: tuple[int, list[list[int]]] | None = None

    @property
    def batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch."""
        if self._made is None or self._made[0] != self.epoch:
            self._made = (self.epoch, self._create_batches())
        return self._made[1]

    def _create_batches(self) -> list[list[int]]:
        # Insertion order matters for ties: a group whose batch just filled
        # starts its next buffer after every buffer open at that moment.
        open_buffers: dict[Any, list[int]] = {}
        members: dict[Any, list[int]] = {}
        batches: list[list[int]] = []
        for index in DistributedSampler.__iter__(self):
            group = self.group_ids[index]
            buffer = open_buffers.setdefault(group, [])
            buffer.append(index)
            members.setdefault(group, []).append(index)
            if len(buffer) == self.batch_size:
                batches.append(buffer)
                del open_buffers[group]
                open_buffers[group] = []
        fullest = sorted(open_buffers.items(), key=lambda item: len(item[1]), reverse=True)
        for group, buffer in fullest[: self.num_batches - len(batches)]:
            need = self.batch_size - len(buffer)
            pool = members[group] * math.ceil(need / len(members[group]))
            batches.append(buffer + pool[:need])
        return batches

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError(
            "Use `with sampler.in_epoch(epoch)` instead of `sampler.set_epoch(epoch)`"
        )

    def _set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self.epoch:
            if self._dirty:
                raise _not_reset(epoch, self.epoch, self.progress)
            self.progress = 0
        self.epoch = epoch

    def reset_progress(self) -> None:
        """End the current epoch: the next one starts from its first batch."""
        self.progress = 0
        self._dirty = False
        self.epoch += 1

    _reset_progress = reset_progress

    def state_dict(self) -> dict[str, int]:
        return {"progress": self.progress, "epoch": self.epoch, "num_replicas": self.num_replicas}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or "progress" not in state or "epoch" not in state:
            raise ValueError(
                "state must be the dict state_dict() returned, with 'progress' and 'epoch'; "
                f"got {state!r:.100}"
            )
        progress, epoch = _count(state, "progress"), _count(state, "epoch")
        saved_by = state.get("num_replicas", self.num_replicas)
        if saved_by != self.num_replicas:
            warnings.warn(
                f"grouped batch sampler state saved by {saved_by} rank(s), loaded by "
                f"{self.num_replicas}: each rank's batches depend on the world size, so epoch "
                f"{epoch} starts over (its first {progress} batches per rank are seen again)",
                stacklevel=2,
            )
            progress = 0
        elif progress > self.num_batches:
            raise AdvancedTooFarError(
                f"state['progress']={progress} is past this rank's {self.num_batches} batches "
                "of an epoch"
            )
        self.progress, self.epoch = progress, epoch
        self._dirty = False

    def advance(self) -> None:
        """Record that this rank consumed one more batch."""
        if self.progress + 1 > self.num_batches:
            raise AdvancedTooFarError(
                f"advance() goes past the end of the epoch: all {self.num_batches} batches of "
                "this rank are already consumed"
            )
        self.progress += 1
        self._dirty = True

    def __iter__(self) -> Iterator[list[int]]:  # type: ignore[override]
        yield from self.batches[self.progress :]

    def __len__(self) -> int:
        return self.num_batches

    @contextlib.contextmanager
    def in_epoch(self, epoch: int) -> Iterator[InterruptableDistributedGroupedBatchSampler]:
        """``with sampler.in_epoch(epoch):`` around the epoch's loop; the end
        of the block resets the progress (an exception leaves it, for a
        checkpoint)."""
        self._set_epoch(epoch)
        yield self
        self.reset_progress()


# cycling_utils' README spells them so (its package does not).
InterruptibleDistributedSampler = InterruptableDistributedSampler
InterruptibleSampler = InterruptableSampler
