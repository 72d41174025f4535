"""relaunch: keep distributed PyTorch jobs alive through crashes, preemptions and relaunches.

The Python API is a thin layer over a Rust core (``relaunch._native``).
"""

from typing import TYPE_CHECKING

from relaunch._native import __version__
from relaunch.checkpoint import Checkpoint, Checkpointer
from relaunch.errors import (
    CheckpointError,
    QueueEmptyError,
    RelaunchError,
    StoreConnectionError,
    StoreError,
    StoreRequestError,
    StoreTimeoutError,
    TrackingConfigError,
    TrackingConnectionError,
    TrackingError,
    TrackingRejectedError,
    TrackingTimeoutError,
)
from relaunch.files import download, upload_file
from relaunch.store import Store
from relaunch.tracking import Run, init

if TYPE_CHECKING:
    from relaunch.sampler import InterruptibleSampler


def __getattr__(name: str):
    # `relaunch.preemption` installs signal handlers, so it loads only when
    # used, not with `import relaunch`.
    if name == "preemption":
        import importlib

        return importlib.import_module("relaunch.preemption")
    # The sampler needs torch, which `import relaunch` must not load.
    if name == "InterruptibleSampler":
        from relaunch.sampler import InterruptibleSampler

        return InterruptibleSampler
    raise AttributeError(f"module 'relaunch' has no attribute {name!r}")


__all__ = [
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "InterruptibleSampler",
    "QueueEmptyError",
    "RelaunchError",
    "Run",
    "Store",
    "StoreConnectionError",
    "StoreError",
    "StoreRequestError",
    "StoreTimeoutError",
    "TrackingConfigError",
    "TrackingConnectionError",
    "TrackingError",
    "TrackingRejectedError",
    "TrackingTimeoutError",
    "__version__",
    "download",
    "init",
    "upload_file",
]
