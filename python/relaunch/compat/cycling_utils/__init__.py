"""cycling_utils' API on relaunch: change ``from cycling_utils import ...`` to
``from relaunch.compat.cycling_utils import ...`` and nothing else.

- :func:`atomic_torch_save` and :class:`AtomicDirectory` (``saving``): the
  same calls, on :class:`relaunch.Checkpointer`, so a checkpoint directory
  is committed atomically with a verified manifest and fsynced, and an old
  one is deleted only after the new one is committed.
- :class:`InterruptableDistributedSampler` and :class:`InterruptableSampler`
  (``sampler``; also spelt ``Interruptible...``): the same calls, on
  :class:`relaunch.InterruptibleSampler`, so a resume continues the epoch's
  global order exactly, with the same or another world size, and every epoch
  is shuffled anew.
- :class:`MetricsTracker` and :class:`TimestampedTimer` (``metrics``).

Differences from cycling_utils 0.0.3 are listed in each module and in the
README ("Coming from cycling_utils"). Not provided:
``DistributedShardedDataset`` (an in-memory image-folder loader, not about
interruption; use a map-style dataset with the sampler) and
``InterruptableDistributedGroupedBatchSampler``.
"""

from relaunch.compat.cycling_utils.metrics import MetricsTracker, TimestampedTimer
from relaunch.compat.cycling_utils.sampler import (
    AdvancedTooFarError,
    HasNotResetProgressError,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleDistributedSampler,
    InterruptibleSampler,
)
from relaunch.compat.cycling_utils.saving import AtomicDirectory, atomic_torch_save

__all__ = [
    "AdvancedTooFarError",
    "AtomicDirectory",
    "HasNotResetProgressError",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
    "MetricsTracker",
    "TimestampedTimer",
    "atomic_torch_save",
]
