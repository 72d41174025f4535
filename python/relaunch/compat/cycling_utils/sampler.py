"""cycling_utils' samplers on :class:`relaunch.InterruptibleSampler`.

The calls are cycling_utils': ``advance(n)`` after each batch (``n``: the
samples this rank consumed), ``state_dict()``/``load_state_dict()``,
``set_epoch(epoch)`` (refused while the epoch's progress is not reset),
``reset_progress()`` at the end of an epoch, ``with in_epoch(epoch):``,
``progress`` (samples this rank consumed in the epoch) and ``len()`` (this
rank's samples in a whole epoch, so ``len(loader)`` counts the epoch's
batches and ``enumerate(loader, start=progress // batch_size)`` numbers a
resumed epoch's batches as an uninterrupted one would).

What differs, on purpose:

- **Every epoch is shuffled anew** (``seed + epoch``, as
  ``DistributedSampler``). cycling_utils 0.0.3 draws one order at
  construction and keeps it for every epoch.
- **A resume with another world size continues exactly**: the state records
  how much of the epoch's global order all ranks consumed (and the world
  size), so every sample is seen once per epoch. cycling_utils records a
  per-rank count only, so shrinking the job replays samples and growing it
  skips some, or raises ``AdvancedTooFarError``.
- **reset_progress() ends the epoch**: the next epoch (``epoch + 1``) is
  current afterwards, so a checkpoint taken between ``reset_progress()`` and
  the next ``set_epoch`` resumes at the next epoch; cycling_utils replays the
  finished one.
- ``state_dict()`` holds relaunch's fields (``format``, ``epoch``,
  ``progress`` as the global count, ``dataset_len``, ``seed``, ``shuffle``,
  ``drop_last``, ``num_replicas``). A cycling_utils state (``{"progress",
  "epoch"}`` only) still loads, read as saved by the same world size (it
  does not say which), with a warning.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from relaunch.sampler import InterruptibleSampler as _RelaunchSampler

__all__ = [
    "AdvancedTooFarError",
    "HasNotResetProgressError",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
]


class AdvancedTooFarError(ValueError):
    """``advance`` (or a loaded state) went past this rank's share of the epoch."""


class HasNotResetProgressError(RuntimeError):
    """``set_epoch`` to another epoch while this one's progress was not reset."""


class InterruptableDistributedSampler(_RelaunchSampler):
    """cycling_utils' ``InterruptableDistributedSampler``: same arguments
    (``num_replicas``/``rank`` default to torch.distributed's), counted by
    :meth:`advance` only."""

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last, auto_count=False)
        # Whether advance() ran since the epoch began or was reset.
        self._dirty = False

    @property
    def progress(self) -> int:  # type: ignore[override]
        """Samples this rank consumed in the current epoch (cycling_utils' meaning)."""
        return self._progress() // self.num_replicas

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
            raise HasNotResetProgressError(
                f"set_epoch({epoch}) while epoch {self.epoch} has progress {self.progress}: "
                "call reset_progress() when an epoch ends (or use `with sampler.in_epoch(e):`)"
            )
        super().set_epoch(epoch)

    def reset_progress(self) -> None:
        """End the current epoch: the next one starts from its beginning, and a
        checkpoint taken now resumes there."""
        self._dirty = False
        super().set_epoch(self.epoch + 1)

    _reset_progress = reset_progress

    @contextlib.contextmanager
    def in_epoch(self, epoch: int) -> Iterator[InterruptableDistributedSampler]:  # type: ignore[override]
        """``set_epoch(epoch)``, the block, then ``reset_progress()``; an
        exception leaves the progress as it was (for a checkpoint)."""
        self.set_epoch(epoch)
        yield self
        self.reset_progress()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from state_dict(), not {type(state).__name__}")
        if "format" not in state and set(state) == {"progress", "epoch"}:
            state = self._from_cycling_utils(state)
        super().load_state_dict(state)
        self._dirty = False

    def _from_cycling_utils(self, state: Mapping[str, Any]) -> dict[str, Any]:
        progress, epoch = state["progress"], state["epoch"]
        for name, value in (("progress", progress), ("epoch", epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"state[{name!r}] must be an int >= 0, got {value!r}")
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
        ours = self.state_dict()
        ours.update(epoch=epoch, progress=min(progress * self.num_replicas, len(self.dataset)))
        return ours


class InterruptableSampler(InterruptableDistributedSampler):
    """cycling_utils' ``InterruptableSampler``: one process's whole dataset,
    in order or shuffled per epoch; ``num_replicas``, ``rank`` and
    ``drop_last`` are accepted and ignored, as there."""

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


# cycling_utils' README spells them so (its package does not).
InterruptibleDistributedSampler = InterruptableDistributedSampler
InterruptibleSampler = InterruptableSampler
