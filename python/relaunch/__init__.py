"""relaunch: keep distributed PyTorch jobs alive through crashes, preemptions and relaunches.

The Python API is a thin layer over a Rust core (``relaunch._native``).
"""

from typing import TYPE_CHECKING

from relaunch import _stacks
from relaunch._native import __version__, heartbeat
from relaunch.errors import (
    CheckpointError,
    ProcessStartError,
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
from relaunch.store import Store
from relaunch.tracking import Run, init

# Under `relaunch run`: the launcher can ask this rank for its stacks on a
# hang (a no-op elsewhere).
_stacks.install()
_stacks.beat_at_exit()

if TYPE_CHECKING:
    from relaunch.api import Api
    from relaunch.checkpoint import Checkpoint, Checkpointer
    from relaunch.files import download, upload_file
    from relaunch.media import Histogram, Image, Video
    from relaunch.processes import start_processes
    from relaunch.sampler import InterruptibleSampler

# Loaded on first use, not with `import relaunch`: the sampler needs torch,
# which `import relaunch` must not load, and a launcher or a training loop
# that never checkpoints or uploads should not pay for importing those.
_LAZY = {
    "Api": "relaunch.api",
    "Histogram": "relaunch.media",
    "Image": "relaunch.media",
    "Video": "relaunch.media",
    "Checkpoint": "relaunch.checkpoint",
    "Checkpointer": "relaunch.checkpoint",
    "InterruptibleSampler": "relaunch.sampler",
    "download": "relaunch.files",
    "upload_file": "relaunch.files",
    "start_processes": "relaunch.processes",
}


def __getattr__(name: str):
    import importlib

    # `relaunch.preemption` installs signal handlers, so it loads only when
    # used, not with `import relaunch`.
    if name in ("preemption", "ddp"):
        return importlib.import_module(f"relaunch.{name}")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'relaunch' has no attribute {name!r}")


__all__ = [
    "Api",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "Histogram",
    "Image",
    "InterruptibleSampler",
    "ProcessStartError",
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
    "Video",
    "__version__",
    "download",
    "heartbeat",
    "init",
    "start_processes",
    "upload_file",
]
