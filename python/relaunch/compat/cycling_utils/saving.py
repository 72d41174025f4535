"""cycling_utils' ``atomic_torch_save`` and ``AtomicDirectory`` on
:class:`relaunch.Checkpointer`.

The calls are cycling_utils': every rank builds the saver, calls
``prepare_checkpoint_directory(force_save=)`` (an empty directory to write
into; usually only the master writes ``checkpoint.pt`` there), then
``symlink_latest(that_directory)``, after which the checkpoint is committed
and ``OUTPUT/NAME.latest_checkpoint`` leads to it: a resume reads
``os.path.join(os.readlink(link), "checkpoint.pt")`` as before.

What differs, on purpose:

- **Commit**: ``symlink_latest`` commits through the Checkpointer: every
  rank's files are fsynced and hashed into a manifest, the directory is
  renamed to its final name and ``latest`` swapped, all durable before it
  returns. The link ``NAME.latest_checkpoint`` points (by absolute path) at
  the Checkpointer's ``OUTPUT/NAME/latest``, which always names a committed
  checkpoint, so it never dangles, whatever the output directory's spelling
  (cycling_utils stores a relative target that does not resolve when the
  output directory is relative).
- **Retention after the commit**: ``keep_last=N`` deletes old checkpoints
  only once the new one is committed (cycling_utils deletes them when the
  next save starts, so with ``keep_last=1`` a kill during a save leaves no
  finished checkpoint). ``force_save=True`` checkpoints are never deleted,
  as there.
- **Layout**: checkpoints are ``OUTPUT/NAME/step_00000004`` (the index
  counts saves, from 0), not ``OUTPUT/NAME_checkpoint_4``; an unfinished one
  is a ``.tmp-`` directory that the next saver removes. A stale
  ``NAME.latest_checkpoint_temp`` link (a kill in cycling_utils' swap) is
  removed, not an error forever after.
- **Ranks agree through relaunch's store** (``relaunch run`` or torchrun's
  ``MASTER_ADDR``/``MASTER_PORT``), not torch.distributed: no collective
  runs on the training's process group and ``device`` is not needed. Rank 0
  commits; ``is_master`` is accepted for the calls' sake. ``sync_any``: a
  save is forced (kept) when any rank forces it; ``sync_all`` keeps it the
  same way (relaunch agrees on a forced save when any rank asks); ``async``
  and ``mono``: each process saves alone (``async`` names its saver
  ``NAME_rank_RANK``, as cycling_utils).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from relaunch._checkpoint_files import LATEST, fsync
from relaunch.checkpoint import Checkpointer
from relaunch.errors import CheckpointError

__all__ = ["AtomicDirectory", "atomic_torch_save"]

STRATEGIES = ("sync_any", "sync_all", "async", "mono")


def atomic_torch_save(obj: Any, f: str | os.PathLike[str], **kwargs: Any) -> None:
    """``torch.save(obj, f, **kwargs)`` whole or not at all: written under a
    temporary name in the same directory, fsynced, renamed over ``f``, and
    the directory fsynced. A failure removes the temporary file."""
    import torch

    if not isinstance(f, str | os.PathLike):
        raise TypeError(f"f must be a path (str or os.PathLike), not {type(f).__name__}")
    path = Path(f)
    temp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        torch.save(obj, temp, **kwargs)
        fsync(temp)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    fsync(path.parent if str(path.parent) else ".")


class AtomicDirectory:
    """cycling_utils' ``AtomicDirectory(output_directory, is_master=False,
    name="AtomicDirectory", keep_last=-1, strategy="sync_any", device=...)``.

    ``keep_last``: how many checkpoints to keep (-1 or 0: all), forced ones
    aside. ``strategy``: ``"sync_any"``, ``"sync_all"``, ``"async"`` or
    ``"mono"``. ``device`` is accepted and unused.
    """

    def __init__(
        self,
        output_directory: str | os.PathLike[str],
        is_master: bool = False,
        name: str = "AtomicDirectory",
        keep_last: int = -1,
        strategy: str = "sync_any",
        device: Any = None,
    ) -> None:
        if not isinstance(output_directory, str | os.PathLike):
            raise TypeError(
                f"output_directory must be a path (str or os.PathLike), "
                f"not {type(output_directory).__name__}"
            )
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"name must be a non-empty file name without '/', got {name!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < -1:
            raise ValueError(
                f"keep_last must be an int: -1 or 0 keep every checkpoint, N > 0 the newest N; "
                f"got {keep_last!r}"
            )
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; use one of {', '.join(map(repr, STRATEGIES))}"
            )
        self.output_directory = os.path.abspath(os.fspath(output_directory))
        self.strategy = strategy
        self.keep_last = keep_last
        self.device = device
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.name = f"{name}_rank_{self.rank}" if strategy == "async" else name
        self.is_master = bool(is_master) or strategy in ("async", "mono")
        self.symlink_name = f"{self.name}.latest_checkpoint"
        keep = keep_last if keep_last > 0 else None
        directory = Path(self.output_directory) / self.name
        if strategy in ("sync_any", "sync_all"):
            self._ckpt = Checkpointer(directory, keep_last=keep, strategy=strategy)
        else:
            self._ckpt = Checkpointer(directory, keep_last=keep, rank=0, world_size=1)
        self._open: tuple[Any, Path] | None = None
        steps = self._ckpt.committed_steps()
        self._next = steps[-1] + 1 if steps else 0
        self._point_link(exists=bool(steps))

    @property
    def checkpointer(self) -> Checkpointer:
        """The :class:`relaunch.Checkpointer` underneath (``latest()``, ``load()``)."""
        return self._ckpt

    def is_checkpoint_directory(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is a committed checkpoint of this saver."""
        p = Path(os.path.realpath(path))
        return (
            p.parent == Path(os.path.realpath(self._ckpt.dir)) and (p / "manifest.json").is_file()
        )

    def prepare_checkpoint_directory(self, force_save: bool = False) -> str:
        """Every rank: the empty directory this save writes into. A save
        prepared before and never finished with :meth:`symlink_latest` is
        abandoned (nothing of it is committed)."""
        if not isinstance(force_save, bool):
            raise TypeError(f"force_save must be a bool, not {type(force_save).__name__}")
        if self._open is not None:
            save, _ = self._open
            self._open = None
            with contextlib.suppress(CheckpointError):
                save.__exit__(
                    RuntimeError,
                    RuntimeError("prepare_checkpoint_directory() again before symlink_latest()"),
                    None,
                )
        save = self._ckpt.save(self._next, force=force_save)
        path = save.__enter__()
        if path is None:  # cannot happen: every call to save() wants to save
            raise CheckpointError(f"the save of checkpoint {self._next} was not agreed")
        self._open = (save, path)
        return str(path)

    def symlink_latest(self, checkpoint_directory: str | os.PathLike[str]) -> None:
        """Every rank: commit the prepared checkpoint (once every rank has
        called this) and point ``NAME.latest_checkpoint`` at it."""
        if self._open is None:
            raise RuntimeError(
                "symlink_latest() without prepare_checkpoint_directory(): prepare a directory, "
                "write the checkpoint into it, then call symlink_latest(that directory)"
            )
        save, path = self._open
        if os.path.abspath(os.fspath(checkpoint_directory)) != str(path):
            raise ValueError(
                f"{checkpoint_directory} is not the directory prepare_checkpoint_directory() "
                f"gave ({path})"
            )
        self._open = None
        save.__exit__(None, None, None)
        committed = save.checkpoint
        self._next = (committed.step if committed is not None else self._next) + 1
        self._point_link(exists=True)

    def _point_link(self, exists: bool) -> None:
        """``NAME.latest_checkpoint`` -> ``OUTPUT/NAME/latest`` while a
        checkpoint exists, gone otherwise; a stale ``_temp`` link is removed.
        Every rank may run it: each writes the same link, atomically."""
        out = Path(self.output_directory)
        link = out / self.symlink_name
        stale = out / f"{self.symlink_name}_temp"
        if stale.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        if not exists:
            if link.is_symlink() and not link.exists():
                with contextlib.suppress(FileNotFoundError):
                    link.unlink()
            return
        target = str(Path(self._ckpt.dir).resolve() / LATEST)
        with contextlib.suppress(OSError):
            if os.readlink(link) == target:
                return
        temp = out / f"{self.symlink_name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        os.symlink(target, temp)
        os.replace(temp, link)
        fsync(out)
