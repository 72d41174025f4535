"""cycling_utils' API on relaunch: change ``from cycling_utils import ...`` to
``from relaunch.compat.cycling_utils import ...`` (and
``cycling_utils.X`` to ``relaunch.compat.cycling_utils.X``) and nothing else.

The names and modules of cycling_utils 0.0.3:

- ``saving``: :func:`atomic_torch_save` and :class:`AtomicDirectory`, with
  cycling_utils' ``NAME_checkpoint_N[_force]`` directories and
  ``NAME.latest_checkpoint`` link, committed the way
  :class:`relaunch.Checkpointer` commits (every rank's files fsynced and
  hashed into a manifest before the link moves; ranks agree through
  relaunch's store; old checkpoints deleted only after the new one is
  committed).
- ``sampler``: :class:`InterruptableDistributedSampler` and
  :class:`InterruptableSampler` (also spelt ``Interruptible...``), on
  :class:`relaunch.InterruptibleSampler`, so a resume continues the epoch's
  global order exactly, with the same or another world size, and every
  epoch is shuffled anew; :class:`InterruptableDistributedGroupedBatchSampler`.
  States load across the two packages (see the module).
- ``datasets``: :class:`DistributedShardedDataset`, without torchvision.
- ``metrics``: :class:`MetricsTracker`; ``timing``: :class:`TimestampedTimer`.

Every difference from cycling_utils 0.0.3 is listed in its module and in
the migration guide (docs/guides/cycling-utils.md).
"""

from relaunch.compat.cycling_utils.datasets import DistributedShardedDataset
from relaunch.compat.cycling_utils.metrics import MetricsTracker
from relaunch.compat.cycling_utils.sampler import (
    AdvancedTooFarError,
    HasNotResetProgressError,
    InterruptableDistributedGroupedBatchSampler,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleDistributedSampler,
    InterruptibleSampler,
)
from relaunch.compat.cycling_utils.saving import AtomicDirectory, atomic_torch_save
from relaunch.compat.cycling_utils.timing import TimestampedTimer

__all__ = [
    "AdvancedTooFarError",
    "AtomicDirectory",
    "DistributedShardedDataset",
    "HasNotResetProgressError",
    "InterruptableDistributedGroupedBatchSampler",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
    "MetricsTracker",
    "TimestampedTimer",
    "atomic_torch_save",
]
