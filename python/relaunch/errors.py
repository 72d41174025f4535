"""Every exception relaunch raises, declared in one place.

The native module maps each Rust error kind to one of these (see
``crates/relaunch-py/src/errors.rs``).
"""


class RelaunchError(Exception):
    """Base class of every relaunch error."""


class StoreError(RelaunchError):
    """The rendezvous store failed or answered something unexpected."""


class StoreTimeoutError(StoreError, TimeoutError):
    """A store call did not finish within its timeout (the store is reachable)."""


class StoreConnectionError(StoreError, ConnectionError):
    """The store cannot be reached, or the connection to it broke."""


class StoreRequestError(StoreError, ValueError):
    """The request was refused before sending: a key or value beyond the store's limits."""


class QueueEmptyError(StoreError):
    """A non-blocking ``queue_pop`` found the queue empty."""


class TrackingError(RelaunchError):
    """Logging to the tracking server failed; what was logged stays in the local spool."""


class TrackingTimeoutError(TrackingError, TimeoutError):
    """``flush`` or ``finish`` ran out of time before the server acknowledged everything."""


class TrackingConnectionError(TrackingError, ConnectionError):
    """The tracking server cannot be reached."""


class TrackingRejectedError(TrackingError):
    """The tracking server refused the records: a wrong token, a size limit, a conflict."""


class TrackingConfigError(TrackingError, ValueError):
    """A bad argument: a run id, project, server URL, metric name, or a finished run."""


class CheckpointError(RelaunchError):
    """A checkpoint could not be committed: a rank failed or timed out, a file
    went missing or changed, or the directory is not shared by all ranks."""


class ProcessStartError(RelaunchError):
    """``relaunch.start_processes`` could not start a process: the program is
    missing or not executable, or its log directory cannot be written."""
