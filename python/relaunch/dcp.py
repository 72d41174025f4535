"""``relaunch.dcp``: ``torch.distributed.checkpoint`` (DCP) into relaunch's checkpoints.

DCP's format unchanged (sharded state, resharding on load), with the
:class:`~relaunch.Checkpointer`'s guarantees: the directory of a step is
committed whole or not at all (a kill mid-save leaves the checkpoints before
it as they were), ranks agree through relaunch's store, old ones are pruned,
and with ``ship=`` the committed directory goes to the run through the
chunk store, deduplicated against the last one::

    import torch.distributed.checkpoint as dcp
    import relaunch.dcp

    ckpt = relaunch.Checkpointer("checkpoints", keep_last=3)
    if (last := ckpt.latest()) is not None:                # resume, any world size
        dcp.load(state, storage_reader=relaunch.dcp.Reader(last))
    ...
    with relaunch.dcp.Writer(ckpt, step) as writer:         # every rank
        dcp.save(state, storage_writer=writer)
    # or, the step goes on while the files are written and committed:
    with relaunch.dcp.Writer(ckpt, step) as writer:
        future = dcp.async_save(state, storage_writer=writer)
        writer.track(future)

:class:`Writer` is DCP's ``FileSystemWriter`` writing into the step's
temporary directory; constructing it is the checkpointer's save round (every
rank constructs one; it raises :class:`~relaunch.errors.CheckpointError`
when the strategy decides that no save happens at that step). Each rank's
files are fsynced as DCP writes them; the commit (every file hashed, the
manifest written, the directory renamed) runs when DCP is done with the
directory: on the coordinator at the end of ``finish`` (after ``.metadata``),
on the other ranks in a thread once their own files are written (they wait
there for the coordinator). The next save of the checkpointer, its
``wait()`` and ``close()`` wait for it and raise its error, as after
:meth:`~relaunch.Checkpointer.save_async`. Leaving the ``with`` block
because ``dcp.save`` raised, or before DCP wrote anything, abandons the
save on that rank (the others raise CheckpointError: nothing is committed).

:class:`Reader` is DCP's ``FileSystemReader`` over a committed checkpoint
(the newest by default), checked against its manifest first.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from relaunch._checkpoint_files import STEP_DIR, verify_checkpoint
from relaunch.checkpoint import Checkpoint, Checkpointer
from relaunch.errors import CheckpointError

__all__ = ["Reader", "Writer"]


class _Pending:
    """What the checkpointer waits on before its next save (a thread's
    ``join``/``is_alive``): set once this save is committed or abandoned."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def set(self) -> None:
        self._done.set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class Writer(FileSystemWriter):
    """A DCP ``StorageWriter`` into checkpoint ``step`` of ``checkpointer``
    (see the module doc). ``force`` (default True: a DCP save is asked for
    when it is wanted), ``metrics`` and ``metadata`` are those of
    :meth:`Checkpointer.save`; the other keywords go to ``FileSystemWriter``
    (``thread_count=``, ``single_file_per_rank=``, ...; ``sync_files`` stays
    on, the commit relies on it)."""

    def __init__(
        self,
        checkpointer: Checkpointer,
        step: int,
        *,
        force: bool = True,
        metrics: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        **writer_options: Any,
    ) -> None:
        if not isinstance(checkpointer, Checkpointer):
            raise TypeError(
                f"checkpointer must be a relaunch.Checkpointer, not {type(checkpointer).__name__}"
            )
        if writer_options.get("sync_files") is False:
            raise ValueError(
                "sync_files=False: a relaunch checkpoint is committed only once its files are on "
                "disk; leave sync_files on"
            )
        if "path" in writer_options:
            raise TypeError("path is the checkpointer's: give a Checkpointer and a step")
        save = checkpointer.save(step, force, metrics=metrics, metadata=metadata)
        path = save.__enter__()
        if path is None:
            save.__exit__(None, None, None)
            raise CheckpointError(
                f"no checkpoint is saved at step {step}: the checkpointer's strategy "
                f"({checkpointer.strategy!r}) decided against it on this step; construct the "
                "Writer with force=True on every rank, or only at the steps its save_every names"
            )
        super().__init__(path, **writer_options)
        self.checkpointer = checkpointer
        self.step = save._decision.step if save._decision is not None else step
        self._save = save
        self._pending = _Pending()
        self._written = False
        self._finished = False
        self._coordinator = False
        self._future: Any = None
        checkpointer._hand_off(self._pending)

    # --- DCP's StorageWriter -----------------------------------------------------------

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self._coordinator = is_coordinator

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            future = super().write_data(plan, planner)
            future.wait()  # FileSystemWriter writes before it returns; this surfaces its error
        except BaseException as e:
            self._abandon(e)
            raise
        self._written = True
        if not self._coordinator:
            threading.Thread(
                target=self._commit_quietly, name=f"relaunch-dcp-commit-{self.step}"
            ).start()
        return future

    def finish(self, metadata: Any, results: Any) -> None:
        try:
            super().finish(metadata, results)
        except BaseException as e:
            self._abandon(e)
            raise
        self._finished = True
        try:
            self.checkpointer._commit(self._save, None)
        finally:
            self._pending.set()

    # --- the save's end ----------------------------------------------------------------

    def _commit_quietly(self) -> None:
        """A non-coordinator's part of the commit; an error is raised by the
        checkpointer's next save, ``wait()`` or ``close()``."""
        try:
            self.checkpointer._commit(self._save, None)
        except BaseException as e:
            self.checkpointer._async_error = e
        finally:
            self._pending.set()

    def _abandon(self, error: BaseException) -> None:
        if not self._pending.is_alive():
            return
        try:
            self.checkpointer._commit(self._save, error)
        finally:
            self._pending.set()

    def track(self, future: Any) -> Any:
        """Ties the future of ``dcp.async_save`` to this save: leaving the
        ``with`` block no longer abandons it, and if the future fails before
        DCP wrote, the save is abandoned. Returns the future."""
        self._future = future

        def done(f: Any) -> None:
            error = f.exception() if hasattr(f, "exception") else None
            if error is not None:
                self._abandon(error)

        if hasattr(future, "add_done_callback"):
            future.add_done_callback(done)
        return future

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self._abandon(exc)
        elif self._future is None and not self._written and not self._finished:
            self._abandon(
                CheckpointError(f"the with-block of step {self.step} left before DCP wrote into it")
            )

    @property
    def committed(self) -> Checkpoint | None:
        """The committed checkpoint, once this rank's part of the commit is done."""
        return self._save.checkpoint


class Reader(FileSystemReader):
    """A DCP ``StorageReader`` of a committed checkpoint: a
    :class:`~relaunch.Checkpoint`, a checkpointer (its :meth:`latest`), or
    the path of a committed step directory. Its files are checked against
    the manifest first (``verify``: ``"sizes"``, or ``"full"`` for every
    byte's BLAKE3)."""

    def __init__(
        self,
        checkpoint: Checkpoint | Checkpointer | str | os.PathLike,
        *,
        verify: str = "sizes",
    ) -> None:
        if verify not in ("sizes", "full"):
            raise ValueError(f'verify must be "sizes" or "full", got {verify!r}')
        if isinstance(checkpoint, Checkpointer):
            found = checkpoint.latest(verify)
            if found is None:
                raise CheckpointError(f"no committed checkpoint in {checkpoint.dir} to load")
            checkpoint = found
        else:
            path = Path(
                os.fspath(checkpoint.path if isinstance(checkpoint, Checkpoint) else checkpoint)
            )
            match = STEP_DIR.match(path.name)
            if match is None or not path.is_dir():
                raise CheckpointError(
                    f"{path} is not a committed checkpoint directory (step_NNNNNNNN with a "
                    "manifest); give a Checkpoint, a Checkpointer or such a directory"
                )
            step = int(match.group(1))
            manifest, problem = verify_checkpoint(path, step, full=verify == "full")
            if manifest is None:
                raise CheckpointError(f"{path} does not verify against its manifest: {problem}")
            checkpoint = Checkpoint(path, step, manifest)
        super().__init__(checkpoint.path)
        self.checkpoint = checkpoint
