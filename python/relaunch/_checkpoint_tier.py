"""Where committed checkpoints live: the tiers a :class:`Checkpointer` saves
into and resumes from.

A tier is a root directory of ``step_N`` checkpoint directories, each
committed by renaming its temporary (``step_N.tmp-TOKEN``) once its
``manifest.json`` is durable, with its own retention:

- ``disk``: the ``dir`` given to the Checkpointer, shared by every rank,
  kept as ``keep_last``/``keep_every``/``keep_best`` say; it survives the
  job and is what a preempted job resumes from.
- ``memory``: ``$RELAUNCH_SNAPSHOT_DIR/<hash of dir>``, a directory in
  shared memory that ``relaunch run`` creates on each node and keeps across
  every restart of the job (so a crashed rank loses nothing) and removes
  when it exits. Only the newest snapshot is kept; the tier's total size is
  bounded by ``$RELAUNCH_SNAPSHOT_MEMORY`` (``--snapshot-memory``). Over
  several nodes the node's saves go to ``part_I`` below it, replicated to
  the next node (:mod:`relaunch._checkpoint_peer`).

Which step a job resumes from is the newest that verifies in any tier
(:meth:`relaunch.Checkpointer.latest`).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from relaunch import _native
from relaunch._checkpoint_files import (
    MANIFEST,
    STEP_DIR,
    TEMPORARY,
    fsync,
    kept,
    point_latest,
    read_manifest,
    remove,
    verify_checkpoint,
)
from relaunch._checkpoint_snapshot import is_snapshot, load, recycle
from relaunch.errors import CheckpointError

# Set by `relaunch run` (crates/relaunch-launch/src/env.rs): the node's
# memory tier and its budget in bytes.
ENV_SNAPSHOT_DIR = "RELAUNCH_SNAPSHOT_DIR"
ENV_SNAPSHOT_MEMORY = "RELAUNCH_SNAPSHOT_MEMORY"

# Marks an abort that a full memory tier caused: every rank skips that
# snapshot with a warning and trains on, keeping the one before.
TIER_FULL = "memory tier full"

# A temporary of another attempt of a job whose ranks save on their own
# ("async") is only removed once it is this old, unless the attempts are known.
STALE_AGE = 3600.0


class Checkpoint:
    """A committed checkpoint: its directory, step, manifest and tier
    (``"disk"``, or ``"memory"`` for a snapshot held by the launcher)."""

    __slots__ = ("manifest", "path", "step", "tier")

    def __init__(self, path: Path, step: int, manifest: dict[str, Any], tier: str = "disk") -> None:
        self.path = path
        self.step = step
        self.manifest = manifest
        self.tier = tier

    def __repr__(self) -> str:
        return f"Checkpoint(path={str(self.path)!r}, step={self.step}, tier={self.tier!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return (self.path, self.step) == (other.path, other.step)

    def __hash__(self) -> int:
        return hash((self.path, self.step))

    @property
    def files(self) -> dict[str, int]:
        """Each file's name (relative, ``/``-separated) and size in bytes."""
        return {name: entry["size"] for name, entry in self.manifest["files"].items()}

    @property
    def metrics(self) -> dict[str, Any]:
        return self.manifest.get("metrics") or {}

    @property
    def metadata(self) -> dict[str, Any]:
        return self.manifest.get("metadata") or {}

    @property
    def forced(self) -> bool:
        return bool(self.manifest.get("forced"))

    def load_file(self, name: str = "model.pt", map_location: Any = None, **kwargs: Any) -> Any:
        """``torch.load`` of one file of this checkpoint (keyword arguments go
        to it); a memory snapshot written by ``save_async`` is read by
        relaunch (its tensors copied out, ``map_location`` applied)."""
        import torch

        if name not in self.manifest["files"]:
            raise FileNotFoundError(
                f"checkpoint {self.path} has no file {name!r}; it has "
                f"{', '.join(sorted(self.manifest['files'])) or 'no files'}"
            )
        if self.tier == "memory" and is_snapshot(self.path / name):
            return load(self.path / name, map_location, torch)
        return torch.load(self.path / name, map_location=map_location, **kwargs)


class Tier:
    """One root of committed checkpoint directories and its retention."""

    def __init__(
        self,
        name: str,
        root: Path,
        keep_last: int | None,
        keep_every: int | None = None,
        keep_best: tuple[str, str, int] | None = None,
        budget: int | None = None,
        durable: bool = True,
        node_root: Path | None = None,
    ) -> None:
        self.name = name
        self.root = root
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.keep_best = keep_best
        # Bytes the whole node's tier may hold (the memory tier), else None,
        # and the directory they are counted in (the launcher's).
        self.budget = budget
        self.node_root = root.parent if node_root is None else node_root
        # Disk: fsynced and hashed (BLAKE3 per file). Memory: neither; a
        # snapshot is whole by its rename, and lives only as long as the node.
        self.durable = durable
        # The memory tier keeps a pruned snapshot's large files here, for
        # the next snapshot to write over (relaunch._checkpoint_snapshot).
        self.spare = None if durable else root / "spare"

    def __repr__(self) -> str:
        return f"Tier({self.name!r}, {str(self.root)!r})"

    def step_dirs(self) -> list[tuple[int, Path]]:
        out = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for entry in entries:
            match = STEP_DIR.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                out.append((int(match.group(1)), Path(entry.path)))
        return sorted(out)

    def committed_steps(self) -> list[int]:
        return sorted(s for s, p in self.step_dirs() if (p / MANIFEST).exists())

    def newest(self, full: bool, stacklevel: int) -> Checkpoint | None:
        """The newest checkpoint that verifies; each newer one that does not
        is skipped with a warning saying what is wrong with it."""
        for step, path in reversed(self.step_dirs()):
            manifest, problem = verify_checkpoint(path, step, full=full)
            if manifest is not None:
                return Checkpoint(path, step, manifest, self.name)
            warnings.warn(
                f"relaunch.Checkpointer: skipping checkpoint {path}: {problem}; "
                "falling back to an older checkpoint",
                stacklevel=stacklevel + 1,
            )
        return None

    def temporary(self, step: int, token: str) -> Path:
        return self.root / f"step_{step:08d}.tmp-{token}"

    def final(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def commit(self, tmp: Path, step: int, session: str, replace: bool = False) -> Path:
        """Renames ``tmp``, whose manifest is durable, to its final name and
        points ``latest`` at it: the rename is the commit. A checkpoint of
        the same step already there is an error unless it does not verify
        or ``replace``."""
        if self.durable:
            fsync(tmp)
        final = self.final(step)
        aside = None
        if final.exists():
            if not replace and verify_checkpoint(final, step, full=True)[0] is not None:
                raise CheckpointError(
                    f"{final} appeared while step {step} was being saved (another "
                    'rank or process saves into this directory: with strategy="async" only '
                    "one rank may save a given step)"
                )
            # A checkpoint of this step that did not verify (latest() skipped
            # it): moved aside, then replaced.
            aside = self.root / f"{final.name}.old-{session}-{os.urandom(4).hex()}"
            os.rename(final, aside)
        os.rename(tmp, final)
        point_latest(self.root, final.name, f"{session}-{os.urandom(4).hex()}")
        if self.durable:
            fsync(self.root)
        if aside is not None:
            remove(aside)
        return final

    def check_room(self, tmp: Path, size: int, step: int) -> None:
        """The memory tier's bound, before a snapshot of ``size`` bytes in
        ``tmp`` is committed: a snapshot that can never fit twice is an
        error; one that does not fit now (other snapshots, other jobs'
        files) is skipped (:data:`TIER_FULL`), keeping the one before."""
        if self.budget is None:
            return
        if 2 * size > self.budget:
            raise CheckpointError(
                f"a memory snapshot of step {step} takes {_mib(size)}, and the memory tier must "
                f"hold two (the newest and the one being written) within its "
                f"{_mib(self.budget)} (relaunch run --snapshot-memory): raise --snapshot-memory "
                "to at least twice the snapshot, or take memory snapshots of less state"
            )
        node_tier = self.node_root
        used = tree_size(node_tier, skip=tmp)
        if used + size > self.budget:
            raise CheckpointError(
                f"{TIER_FULL}: the snapshot of step {step} ({_mib(size)}) is not kept: the "
                f"node's memory tier {node_tier} already holds {_mib(used)} of its "
                f"{_mib(self.budget)} (--snapshot-memory); the newest snapshot before it stays"
            )

    def prune(self, just_committed: int, session: str) -> None:
        """Deletes what retention does not keep: committed checkpoints only,
        never the newest, the one just committed, forced ones or unreadable ones."""
        committed: dict[int, dict[str, Any] | None] = {}
        paths = {}
        for step, path in self.step_dirs():
            manifest, _ = read_manifest(path, step)
            if manifest is None and not (path / MANIFEST).exists():
                continue  # not a commit of ours: never touched
            committed[step] = manifest
            paths[step] = path
        keep = kept(committed, self.keep_last, self.keep_every, self.keep_best)
        keep.add(just_committed)
        for step in sorted(set(committed) - keep):
            aside = self.root / f"{paths[step].name}.old-{session}-{os.urandom(4).hex()}"
            try:
                os.rename(paths[step], aside)
            except FileNotFoundError:
                continue  # another rank ("async") pruned it first
            except OSError as e:
                # The new checkpoint is committed all the same: say so, do not raise.
                warnings.warn(
                    f"relaunch.Checkpointer: cannot delete old checkpoint {paths[step]}: {e}",
                    stacklevel=5,
                )
                continue
            if self.spare is not None:
                recycle(aside, self.spare)
            remove(aside)

    def clean_stale(self, in_progress: set[str], own_session: str | None) -> None:
        """Removes temporaries that crashed processes left behind: all of
        them, or (``own_session`` given: ranks saving on their own) those of
        other sessions, and ones of unknown sessions only once stale."""
        now = time.time()
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return
        for entry in entries:
            match = TEMPORARY.match(entry.name)
            if not match or entry.path in in_progress:
                continue
            if own_session is not None:
                if own_session:
                    if match.group(1) == own_session:
                        continue
                else:
                    try:
                        if now - entry.stat(follow_symlinks=False).st_mtime < STALE_AGE:
                            continue
                    except FileNotFoundError:
                        continue
            remove(Path(entry.path))


def memory_tier(disk: Path, memory_every: int | None, rank: int) -> Tier | None:
    """The memory tier for checkpoints of ``disk``, or None (with one warning
    saying why) where ``memory_every`` cannot be served."""
    if memory_every is None:
        return None
    node = os.environ.get(ENV_SNAPSHOT_DIR, "").strip()
    if not node:
        if rank == 0:
            warnings.warn(
                f"relaunch.Checkpointer: memory_every={memory_every} needs a memory tier, which "
                f"`relaunch run` provides ({ENV_SNAPSHOT_DIR} is unset here): only disk "
                "checkpoints are taken",
                stacklevel=3,
            )
        return None
    raw = os.environ.get(ENV_SNAPSHOT_MEMORY, "").strip()
    try:
        budget = int(raw) if raw else None
    except ValueError:
        raise ValueError(
            f"environment variable {ENV_SNAPSHOT_MEMORY}={raw!r} is not a number of bytes"
        ) from None
    root = Path(node) / _native.hash_bytes(str(disk).encode())[:12]
    try:
        root.mkdir(exist_ok=True)
    except OSError as e:
        raise CheckpointError(
            f"cannot use the memory tier {node} ({ENV_SNAPSHOT_DIR}): {e}; it is "
            "created by `relaunch run` and lives as long as the launcher"
        ) from None
    return Tier("memory", root, keep_last=1, budget=budget, durable=False)


def tree_size(root: Path, skip: Path | None = None) -> int:
    """Bytes in the files below ``root``, but for those below ``skip``."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
