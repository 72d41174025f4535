"""``relaunch.Checkpointer``: checkpoint directories that are either complete or absent.

Every rank writes its files into one temporary directory per step; on leaving
the ``with`` block the checkpoint is committed::

    ckpt = relaunch.Checkpointer("checkpoints", keep_last=3)
    resume = ckpt.latest()            # newest checkpoint that verifies, or None
    for step in range(resume.step + 1 if resume else 0, total):
        train_step()
        with ckpt.save(step, force=preemption.reached(step)) as path:
            if path is not None:      # None: no save at this step
                torch.save(model.state_dict(), path / f"model.{rank}.pt")

On disk, ``DIR`` holds::

    step_00000042/               a committed checkpoint: the ranks' files and
        manifest.json            every file's size and BLAKE3, the step, metrics,
                                 how long the save took (save_seconds)
    latest -> step_00000042      symlink to the newest commit (for people and tools)
    step_00000043.tmp-TOKEN/     being written (removed when stale)
    step_00000007.old-TOKEN/     being deleted (removed when stale)

A commit: every rank leaves the block (a barrier through the store); the ranks
share out the files, fsync and hash them and report to rank 0; rank 0 writes
``manifest.json`` atomically (temporary name, fsync, rename), fsyncs the
directory, renames it to its final name, swaps ``latest`` (a new symlink
renamed over the old one), fsyncs ``DIR``, and only then tells the other
ranks, whose ``with`` blocks return, and prunes old checkpoints. The rename
is the commit: a directory with its final name has a complete manifest. So a
kill at any instant leaves the previous checkpoints as they were, and once
the ``with`` block returned the checkpoint survives a kill, and power loss
too where the file system honours fsync (retention deletes old checkpoints
only after that). ``latest()`` checks the manifest before it trusts a
checkpoint and falls back past any that does not verify, with a warning.

Ranks agree through relaunch's store (``RELAUNCH_STORE`` under ``relaunch
run``; ``MASTER_ADDR``/``MASTER_PORT`` under torchrun; or ``store=``), never
through torch.distributed, so a hung collective cannot hang a checkpoint.
Each call to :meth:`Checkpointer.save` is one round: every rank votes whether
it wants to save (``force``, or ``save_every`` says the step is due); the
strategy turns the votes into one decision that every rank gets, with the
step and the name of the temporary directory:

- ``"sync_any"``: all ranks save when any rank wants to (a rank that saw a
  preemption signal forces the save on all);
- ``"sync_all"``: all ranks save only when every rank wants to;
- ``"async"``: no agreement: each rank saves when it wants to and commits its
  own files alone as a whole checkpoint, without waiting for the others. Use
  it when one rank (usually rank 0) writes the whole state; two ranks saving
  the same step collide, and the second one fails with CheckpointError.

The directory must be shared by all ranks (one file system); rank 0 checks
that it sees every file the others wrote.

With ``memory_every=N`` the steps between disk checkpoints that N divides
are saved the same way into the node's memory tier, which ``relaunch run``
holds across restarts (:mod:`relaunch._checkpoint_tier`): a crashed rank
resumes from there, a stopped job from disk. ``latest()`` takes the newest
in either tier. Over several nodes each node commits its ranks' part of a
snapshot and replicates it to the next node (:mod:`relaunch._checkpoint_peer`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from relaunch import _native, _rng
from relaunch._checkpoint_agree import (
    ENV_STORE,
    Coordinator,
    Decision,
    connect_store,
    failed_key,
)
from relaunch._checkpoint_args import (
    DEFAULT_TIMEOUT,
    ENV_ATTEMPT,
    ENV_RUN_ID,
    check_step,
    env,
    env_int,
    json_dict,
    keep_best_spec,
    positive,
)
from relaunch._checkpoint_files import (
    FORMAT,
    MANIFEST,
    canonical,
    fsync_and_hash,
    gather,
    read_manifest,
    remove,
    safe_name,
    walk,
    write_atomic,
)
from relaunch._checkpoint_peer import Parts, node_layout, part_roots
from relaunch._checkpoint_ship import Shipper, exit_timeout
from relaunch._checkpoint_snapshot import Writer as SnapshotWriter
from relaunch._checkpoint_stage import Stager
from relaunch._checkpoint_tier import TIER_FULL, Checkpoint, Tier, memory_tier
from relaunch._checkpoint_whole import tier_key, whole_snapshot
from relaunch.errors import CheckpointError

__all__ = ["Checkpoint", "CheckpointError", "Checkpointer"]

STRATEGIES = ("sync_any", "sync_all", "async")

# Each rank's random generators, saved with every checkpoint (``rng=True``).
RNG_FILE = "rng_state.{rank}.json"
_RNG_NAME = re.compile(r"rng_state\.\d+\.json")
# Whether this process said that a resume leaves the generators alone.
_RNG_SAID = False

# Temporary directories this process is writing, which no Checkpointer of
# this process cleans up as stale.
_IN_PROGRESS: set[str] = set()


# --- the checkpointer ------------------------------------------------------------


class _Save:
    """What :meth:`Checkpointer.save` returns: a context manager whose
    ``__enter__`` agrees on the save and gives the directory to write into
    (``None`` when no save is due), and whose ``__exit__`` commits.

    After the block, :attr:`checkpoint` is the committed checkpoint.
    """

    def __init__(
        self, owner: Checkpointer, step: int, force: bool, metrics: dict, metadata: dict
    ) -> None:
        self._owner = owner
        self.step = step
        self.force = force
        self.metrics = metrics
        self.metadata = metadata
        self.path: Path | None = None
        self.checkpoint: Checkpoint | None = None
        self.rng: str | None = None  # the random generators as of entering, as JSON
        self._round = -1
        self._decision: Decision | None = None
        self.tier: Tier | None = None
        self._entered = False
        self.started = 0.0

    def __enter__(self) -> Path | None:
        if self._entered:
            raise RuntimeError("a save() context can be entered only once; call save() again")
        self._entered = True
        self.started = time.monotonic()
        _native.heartbeat(self.step)
        self._owner._begin(self)
        return self.path

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        try:
            # True: a memory snapshot that did not fit, skipped with a warning.
            return self._owner._end(self, exc)
        finally:
            _native.heartbeat(self.step)


class Checkpointer:
    """Atomic, verified checkpoints in ``dir``, shared by every rank of a job.

    Arguments:

    - ``keep_last``: how many of the newest checkpoints to keep (None: all).
    - ``keep_every``: also keep every checkpoint whose step is a multiple of it.
    - ``keep_best``: also keep the best by a metric given to ``save(...,
      metrics=)``: ``("val_loss", "min")``, or ``("acc", "max", 3)`` for three.
    - ``strategy``: ``"sync_any"``, ``"sync_all"`` or ``"async"`` (see the module).
    - ``store``: a :class:`relaunch.Store` to agree through; by default the
      job's (``RELAUNCH_STORE``, else ``MASTER_ADDR``/``MASTER_PORT``). A
      single process needs none.
    - ``save_every``: a step is due when it is a multiple of it (None: every
      call to ``save`` wants to save); ``force=True`` wants to save anyway.
    - ``memory_every``: at the steps that are multiples of it and not due
      for disk, the save goes to the memory tier instead: a snapshot in
      memory that ``relaunch run`` holds on the node, across every restart
      of the job (``--snapshot-memory`` bounds it), so a crashed rank
      resumes from there. Needs ``save_every``. Only the newest snapshot is
      kept; the launcher drops them all when it exits, so a job stopped for
      good resumes from disk. Over several nodes each node keeps its
      ranks' part and a replica of the previous node's, so a lost node
      loses nothing (``relaunch._checkpoint_peer``), and ``latest()`` must
      be called on every rank. Outside ``relaunch run`` (no memory tier)
      it warns once and takes only disk checkpoints.
    - ``rank``, ``world_size``: default to ``RANK`` and ``WORLD_SIZE``.
    - ``timeout``: seconds to wait for the other ranks at each stage of a save.
      Under ``relaunch run`` a rank stops waiting within a second of another
      rank's failure (the launcher's ``relaunch/RUN/workers/failed/ATTEMPT`` key) and
      raises :class:`CheckpointError` naming it.
    - ``ship``: upload each committed checkpoint to the tracking server in the
      background (``relaunch ckpt pull`` brings it back); by default when
      running under ``relaunch run --server`` (``RELAUNCH_SERVER`` and
      ``RELAUNCH_RUN_ID`` set). :meth:`close` and the interpreter's exit wait
      for the upload in flight, at most ``RELAUNCH_EXIT_TIMEOUT`` seconds.
    - ``rng``: save each rank's random generators with every checkpoint
      (file ``rng_state.RANK.json``: torch CPU and CUDA, numpy, Python's
      ``random``, and the state a DataLoader's base seed was drawn from when
      the save falls inside an epoch) and put them back in :meth:`latest`,
      so that the resumed steps draw what an uninterrupted run would
      (dropout, augmentation, shuffling). ``rng=False`` leaves the
      generators alone and says so once at resume.

    Forced checkpoints, the newest and those retention keeps are never
    deleted; rank 0 prunes the rest only after a new checkpoint is committed.
    Construction creates ``dir`` if needed and, on rank 0, removes
    temporaries that earlier processes left.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        keep_last: int | None = 3,
        keep_every: int | None = None,
        keep_best: tuple | None = None,
        strategy: str = "sync_any",
        store: Any = None,
        *,
        save_every: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        ship: bool | None = None,
        memory_every: int | None = None,
        rng: bool = True,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; use one of {', '.join(map(repr, STRATEGIES))}"
            )
        self.keep_last = positive(keep_last, "keep_last (how many checkpoints to keep)")
        self.keep_every = positive(keep_every, "keep_every")
        self.keep_best = keep_best_spec(keep_best)
        self.save_every = positive(save_every, "save_every")
        self.memory_every = positive(memory_every, "memory_every")
        if self.memory_every is not None and self.save_every is None:
            raise ValueError(
                f"memory_every={memory_every} needs save_every= too, the steps of the disk "
                "checkpoints: without it every save goes to disk and none to memory"
            )
        self.strategy = strategy
        if not isinstance(rng, bool):
            raise TypeError(
                f"rng must be a bool (save and restore the random generators), "
                f"not {type(rng).__name__}"
            )
        self.rng = rng
        if rng:
            _rng.loop_seeds()  # watches DataLoader iterators from now on
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.rank = env_int("RANK", 0) if rank is None else rank
        self.world_size = env_int("WORLD_SIZE", 1) if world_size is None else world_size
        for name, value in (("rank", self.rank), ("world_size", self.world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is not in a world of {self.world_size} ranks "
                "(rank must be in 0..world_size-1)"
            )
        if not isinstance(dir, str | os.PathLike):
            raise TypeError(f"dir must be a path (str or os.PathLike), not {type(dir).__name__}")
        # Resolved once: a later chdir does not move the checkpoints.
        self.dir = Path(os.path.abspath(os.fspath(dir)))
        if self.dir.exists() and not self.dir.is_dir():
            raise NotADirectoryError(
                f"checkpoint directory {self.dir} exists and is not a directory; "
                "pass the path of a directory (it is created if missing)"
            )
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise NotADirectoryError(
                f"cannot create checkpoint directory {self.dir}: a file is in the way"
            ) from None

        run_id, attempt = env(ENV_RUN_ID), env(ENV_ATTEMPT)
        self._session = _native.hash_bytes(f"{run_id}\0{attempt}".encode())[:8]
        self._session_known = run_id is not None and attempt is not None
        self._store_arg = store
        self._coordinator: Coordinator | None = None
        self._key_prefix = (
            f"relaunch/{run_id}/workers/ckpt/" if run_id else "relaunch/ckpt/"
        ) + f"{_native.hash_bytes(str(self.dir).encode())[:12]}/{attempt or 0}/"
        if (
            self._coordinated
            and store is None
            and os.environ.get(ENV_STORE) is None
            and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
        ):
            raise ValueError(
                f"Checkpointer needs a store to agree across {self.world_size} ranks: run under "
                "`relaunch run` (it sets RELAUNCH_STORE) or torchrun, or pass "
                'store=relaunch.Store(host, port); or use strategy="async"'
            )

        self._lock = threading.Lock()
        self._active: _Save | None = None
        self._last_step: int | None = None
        self._floor: int | None = None
        self._floor_known = False
        self._abandoned: list[Path] = []
        self._async: threading.Thread | None = None
        self._async_error: BaseException | None = None
        self._async_step: int | None = None
        self._tier_full_warned = False
        self._stager = Stager()
        self._snapshots = SnapshotWriter()
        self._shipper = self._make_shipper(ship)
        self._disk = Tier("disk", self.dir, self.keep_last, self.keep_every, self.keep_best)
        self._memory = memory_tier(self.dir, self.memory_every, self.rank)
        # Over several nodes: each node's part of a snapshot, replicated to the next node.
        self._parts: Parts | None = None
        layout = node_layout(self.world_size) if self._memory is not None else None
        if layout is not None and self._coordinated and self._memory is not None:
            self._parts = Parts(self._memory, *layout)
            self._memory = self._parts.tier
            if self._parts.leader:
                for root in part_roots(self._parts.node_tier):
                    Tier("memory", root, None).clean_stale(_IN_PROGRESS, None)
                self._parts.whole.clean_stale(_IN_PROGRESS, None)
                store = self._coordinator_().store
                key = tier_key(self._key_prefix, self._parts.node)
                self._parts.start_serving(lambda text: store.set(key, text))
        elif self._memory is not None and self.world_size > 1:
            local_world = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
            why = None
            if layout is not None:
                why = (
                    'over several nodes with strategy="async" (each rank commits alone, and '
                    "only its own node would hold it)"
                )
            elif local_world not in ("", str(self.world_size)):
                why = "over nodes of different sizes (a node's part is named by its node rank)"
            if why is not None:
                if self.rank == 0:
                    warnings.warn(
                        f"relaunch.Checkpointer: memory_every={memory_every} is not served "
                        f"{why}: only disk checkpoints are taken",
                        stacklevel=2,
                    )
                self._memory = None
        if self.rank == 0 or self.strategy == "async":
            for tier in self._tiers:
                if self._parts is None or tier is not self._memory:
                    tier.clean_stale(_IN_PROGRESS, self._keep_session)

    def _make_shipper(self, ship: bool | None) -> Shipper | None:
        if ship is not None and not isinstance(ship, bool):
            raise TypeError(f"ship must be True, False or None, not {type(ship).__name__}")
        server = os.environ.get("RELAUNCH_SERVER", "").strip()
        run = os.environ.get("RELAUNCH_RUN_ID", "").strip()
        if ship is None:
            ship = bool(server and run)
        if not ship:
            return None
        if not (server and run):
            raise ValueError(
                "ship=True needs a tracking server and a run: run under `relaunch run --server "
                "URL` (it sets RELAUNCH_SERVER and RELAUNCH_RUN_ID), or set both"
            )
        # The rank that commits ships: rank 0, or each rank saving on its own.
        if self.rank != 0 and self.strategy != "async":
            return None
        return Shipper(server, os.environ.get("RELAUNCH_SERVER_TOKEN") or None, run)

    def wait_shipped(self, timeout: float | None = None) -> bool:
        """Waits until the newest committed checkpoint is on the tracking
        server; False after ``timeout`` seconds. True at once when not shipping."""
        return self._shipper is None or self._shipper.wait(timeout)

    def __repr__(self) -> str:
        return (
            f"Checkpointer({str(self.dir)!r}, keep_last={self.keep_last}, "
            f"keep_every={self.keep_every}, keep_best={self.keep_best}, "
            f"strategy={self.strategy!r}, rank={self.rank}, world_size={self.world_size})"
        )

    @property
    def _coordinated(self) -> bool:
        return self.world_size > 1 and self.strategy != "async"

    @property
    def _cleans_up(self) -> bool:
        """Whether this rank removes aborted saves' directories: rank 0, and
        each node leader for its node's parts of memory snapshots."""
        return self.rank == 0 or (self._parts is not None and self._parts.leader)

    @property
    def _tiers(self) -> list[Tier]:
        return [self._disk] if self._memory is None else [self._disk, self._memory]

    @property
    def _keep_session(self) -> str | None:
        """Whose temporaries a rank's cleanup leaves: none when no other rank
        can be saving yet (rank 0 votes in every save of a synchronized
        job); this session's when ranks save on their own ("" when the
        session is unknown: then only stale ones go)."""
        if self.strategy == "async" and self.world_size > 1:
            return self._session if self._session_known else ""
        return None

    # --- reading -------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps of the committed checkpoints in ``dir`` (final name and a
        manifest), oldest first, without verifying them (disk only)."""
        return self._disk.committed_steps()

    def latest(self, verify: str = "sizes") -> Checkpoint | None:
        """The newest committed checkpoint that verifies, or None: on disk
        or, with ``memory_every``, in the node's memory tier, whichever is
        newer (:attr:`Checkpoint.tier` says which).

        ``verify="sizes"`` (default) checks the manifest (its own BLAKE3, its
        step) and every file's presence and size; ``verify="full"`` also
        hashes every file. A newer checkpoint that fails is skipped with a
        warning that says what is wrong with it. Saves of this Checkpointer
        must then be of later steps than the one returned (a corrupt newer
        checkpoint of the same step is replaced).
        """
        if verify not in ("sizes", "full"):
            raise ValueError(f'verify must be "sizes" or "full", got {verify!r}')
        newest, found = self._newest(verify == "full", 3)
        if self._memory is not None and self.rank == 0:
            _say_resume(newest, found)
        if newest is not None:
            self._restore_rng(newest)
        return newest

    def _restore_rng(self, checkpoint: Checkpoint) -> None:
        """Puts back this rank's random generators as saved with
        ``checkpoint`` (see ``rng``), or says once why they are not."""
        global _RNG_SAID
        name = RNG_FILE.format(rank=self.rank)
        saved = sorted(n for n in checkpoint.files if _RNG_NAME.fullmatch(n))
        why = None
        if not self.rng:
            why = "rng=False"
        elif not saved:
            why = (
                f"checkpoint {checkpoint.path} holds none (saved with rng=False or by an "
                "earlier relaunch)"
            )
        elif self._coordinated and (len(saved) != self.world_size or name not in saved):
            why = (
                f"checkpoint {checkpoint.path} holds those of {len(saved)} rank(s), this job "
                f"has {self.world_size} (resume on as many ranks for an exact resume)"
            )
        elif name not in saved:  # strategy="async": another rank saved it alone
            why = f"checkpoint {checkpoint.path} holds none of rank {self.rank}"
        if why is not None:
            if (self.rank == 0 or not self._coordinated) and not _RNG_SAID:
                _RNG_SAID = True
                warnings.warn(
                    f"relaunch.Checkpointer: the random generators are not restored: {why}; "
                    "the resumed steps draw other random numbers (dropout masks, "
                    "augmentations) than an uninterrupted run",
                    stacklevel=3,
                )
            return
        state, loader = _rng.from_json(
            (checkpoint.path / name).read_text(), str(checkpoint.path / name)
        )
        seeds = _rng.loop_seeds()
        if seeds is None:
            _rng.restore(state)
        else:
            seeds.resume(state, loader)

    def _newest(self, full: bool, stacklevel: int) -> tuple[Checkpoint | None, list[Checkpoint]]:
        found = []
        for tier in self._tiers:  # a loop, not a comprehension: one frame less
            if self._parts is not None and tier is self._memory:
                disk_step = found[0].step if found else None
                checkpoint = whole_snapshot(
                    self._parts, self._coordinator_(), self._session, disk_step, _IN_PROGRESS,
                    stacklevel,
                )  # fmt: skip
            else:
                checkpoint = tier.newest(full, stacklevel)
            if checkpoint is not None:
                found.append(checkpoint)
        newest = max(found, key=lambda c: c.step, default=None)
        # What the caller resumes from: later saves must be after it.
        self._floor, self._floor_known = (newest.step if newest else None), True
        return newest, found

    def load(
        self,
        name: str = "model.pt",
        map_location: Any = None,
        *,
        verify: str = "sizes",
        **kwargs: Any,
    ) -> Any:
        """``torch.load`` of file ``name`` of :meth:`latest` (None when there
        is no checkpoint); the counterpart of :meth:`save_async`."""
        checkpoint = self.latest(verify)
        if checkpoint is None:
            return None
        return checkpoint.load_file(name, map_location=map_location, **kwargs)

    # --- saving --------------------------------------------------------------

    def save(
        self,
        step: int,
        force: bool = False,
        *,
        metrics: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> _Save:
        """A context manager for the save of ``step``; every rank calls it.

        ``with ckpt.save(step) as path:`` gives the temporary directory that
        every rank writes into, or None when no save is due (see ``strategy``
        and ``save_every``); leaving the block commits the checkpoint on every
        rank, and an exception in it on any rank aborts it (nothing is
        committed; the exception propagates, the other ranks raise
        :class:`CheckpointError`). ``metrics`` (rank 0's) serve ``keep_best``;
        ``metadata`` goes into the manifest.
        """
        if not isinstance(force, bool):
            raise TypeError(f"force must be a bool, not {type(force).__name__}")
        return _Save(
            self,
            check_step(step),
            force,
            json_dict(metrics, "metrics"),
            json_dict(metadata, "metadata"),
        )

    def _wants(self, step: int, force: bool) -> bool:
        return force or self.save_every is None or step % self.save_every == 0

    def _tier_for(self, decision: Decision) -> Tier | None:
        """Disk when the ranks agreed to save; else the memory tier at its
        steps (the same on every rank: no vote needed); else no save."""
        if decision.save:
            return self._disk
        if self._memory is not None and self.memory_every is not None:
            if decision.step % self.memory_every == 0:
                return self._memory
        return None

    def _check_step(self, step: int) -> None:
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step {step} is not after step {self._last_step}, the last one saved: "
                "steps must increase from one save to the next"
            )
        if not self._floor_known:
            with warnings.catch_warnings():
                if self.rank != 0:
                    warnings.simplefilter("ignore")
                newest, _ = self._newest(False, 3)
            self._floor, self._floor_known = (newest.step if newest else None), True
        if self._floor is not None and step <= self._floor:
            raise ValueError(
                f"{self.dir} already holds a checkpoint of step {self._floor}, which is not "
                f"before step {step}: resume from ckpt.latest() and save later steps, or use "
                "another directory"
            )

    def _begin(self, save: _Save) -> None:
        self._raise_async_error()  # waits for a save_async in flight
        with self._lock:
            if self._active is not None:
                raise RuntimeError(
                    f"a save of step {self._active.step} is still open; leave its with-block first"
                )
            self._active = save
        if self.rng and _rng.loop_seeds() is not None:
            _rng.loop_seeds().disarm()  # the resumed steps are under way
        try:
            wants = self._wants(save.step, save.force)
            if self._coordinated:
                coordinator = self._coordinator_()
                save._round = coordinator.round
                decision = coordinator.vote(
                    save.step, wants, save.force, self.strategy, self._session
                )
            else:
                token = f"{self._session}-{os.urandom(4).hex()}"
                decision = Decision(wants, save.step, save.force and wants, token)
            tier = self._tier_for(decision)
            if tier is None:
                self._active = None
                return
            if tier is self._memory and self._coordinated:
                # A snapshot's round keys go with the next round, as a disk save's do.
                coordinator = self._coordinator_()
                coordinator.delete_with_next_round(coordinator.save_keys(save._round))
            # After the decision, so that every rank raises, not only those that asked.
            self._check_step(decision.step)
            save._decision, save.tier = decision, tier
            if self._cleans_up:
                self._remove_abandoned()
            tmp = tier.temporary(decision.step, decision.token)
            _IN_PROGRESS.add(str(tmp))
            tmp.mkdir(exist_ok=True)
            save.path = tmp
            if self.rng:
                # As of the step's end, before the with-block (or a save in
                # the background) runs; written at the commit.
                seeds = _rng.loop_seeds()
                save.rng = _rng.to_json(_rng.capture(), None if seeds is None else seeds.at_save())
        except BaseException:
            self._active = None
            raise

    def _end(self, save: _Save, exc: BaseException | None) -> bool:
        try:
            if save._decision is None:
                return False
            return self._commit(save, exc)
        finally:
            self._active = None

    def _commit(self, save: _Save, exc: BaseException | None) -> bool:
        """Commits ``save`` on this rank, or aborts it if ``exc``. Returns
        True when a memory snapshot did not fit (the tier or its file system
        full, on any rank): skipped with a warning, the one before it kept,
        the error (``exc`` too) not raised."""
        memory = save.tier is not None and save.tier is self._memory
        own: BaseException | None = None
        if exc is None and save.rng is not None and save.path is not None:
            try:
                (save.path / RNG_FILE.format(rank=self.rank)).write_text(save.rng)
            except Exception as e:
                exc = own = e
        try:
            self._commit_or_abort(save, exc, memory)
        except BaseException as e:
            if memory and _tier_full(e):
                self._warn_tier_full(e)
                return True
            raise
        if own is not None:
            raise own
        if memory:
            self._tier_full_warned = False
        return False

    def _warn_tier_full(self, e: BaseException) -> None:
        if not self._tier_full_warned:
            self._tier_full_warned = True
            warnings.warn(
                f"relaunch.Checkpointer: memory snapshot skipped: {e} (said once until a "
                "snapshot fits again; disk checkpoints go on)",
                stacklevel=5,
            )

    def _commit_or_abort(self, save: _Save, exc: BaseException | None, memory: bool) -> None:
        decision = save._decision
        assert decision is not None and save.path is not None
        tmp = save.path
        coordinator = self._coordinator if self._coordinated else None
        n = save._round
        try:
            if exc is not None:
                full = memory and _tier_full(exc)
                why = f"{TIER_FULL}: {exc}" if full else f"{type(exc).__name__}: {exc}"
                if coordinator is not None:
                    with contextlib.suppress(Exception):
                        coordinator.leave_block(n, why)
                if full:
                    raise CheckpointError(why)
                return
            if coordinator is not None:
                coordinator.leave_block(n, None)
            if memory and self._parts is not None and coordinator is not None:
                save.checkpoint = self._commit_part(save, decision, tmp, coordinator)
                self._last_step = decision.step
                exc = None
                return
            rank, world = (0, 1) if coordinator is None else (coordinator.rank, coordinator.world)
            report: dict[str, Any] = {"seen": {}, "hashed": {}, "error": None}
            try:
                report["seen"] = walk(tmp)
                mine = sorted(report["seen"])[rank::world]
                report["hashed"] = fsync_and_hash(tmp, mine, save.tier.durable)
            except Exception as e:
                if coordinator is None:
                    raise
                report["error"] = f"rank {rank}: {type(e).__name__}: {e}"
                if rank != 0:
                    coordinator.report(n, report)
                    raise
                # Rank 0 goes on to tell the others why nothing is committed.
            if coordinator is not None and rank != 0:
                coordinator.report(n, report)
                coordinator.committed(n)
                final = save.tier.final(decision.step)
                manifest, _ = read_manifest(final, decision.step)
                save.checkpoint = Checkpoint(
                    final, decision.step, manifest or {"files": {}}, save.tier.name
                )
            else:
                save.checkpoint = self._commit_rank0(save, decision, tmp, report, coordinator)
            self._last_step = decision.step
            exc = None
            if not memory:
                _tell_preemption(save.checkpoint)
            if coordinator is None or rank == 0:
                save.tier.prune(decision.step, self._session)
        except BaseException as e:
            exc = e
            raise
        finally:
            _IN_PROGRESS.discard(str(tmp))
            if exc is not None:
                self._abandon(tmp, now=coordinator is None)

    def _commit_rank0(
        self,
        save: _Save,
        decision: Decision,
        tmp: Path,
        report: dict[str, Any],
        coordinator: Coordinator | None,
    ) -> Checkpoint:
        n = save._round
        try:
            reports = [report]
            if coordinator is not None and report["error"] is None:
                reports += coordinator.reports(n)
            errors = [r["error"] for r in reports if r.get("error")]
            if errors:
                raise CheckpointError("; ".join(errors))
            checkpoint = self._write_commit(save, decision, tmp, reports)
        except BaseException as e:
            if coordinator is not None:
                with contextlib.suppress(Exception):
                    coordinator.announce(n, f"{type(e).__name__}: {e}")
            raise
        if coordinator is not None:
            coordinator.announce(n, "ok")
        if self._shipper is not None and save.tier is self._disk:
            self._shipper.ship(checkpoint.step, checkpoint.path)
        return checkpoint

    def _commit_part(
        self, save: _Save, decision: Decision, tmp: Path, coordinator: Coordinator
    ) -> Checkpoint:
        """A memory snapshot over several nodes: each node leader commits
        its node's part once every rank reported, then rank 0 the whole
        save once every part is committed; the leaders then send their part
        to the next node."""
        parts = self._parts
        assert parts is not None
        n = save._round
        report: dict[str, Any] = {
            "seen": {}, "hashed": {}, "error": None, "node": parts.node, "rank": self.rank
        }  # fmt: skip
        try:
            report["seen"] = walk(tmp)
            mine = sorted(report["seen"])[parts.local_rank :: parts.local_world]
            report["hashed"] = fsync_and_hash(tmp, mine, False)
        except Exception as e:
            report["error"] = f"rank {self.rank}: {type(e).__name__}: {e}"
        coordinator.report(n, report)
        part_keys = [coordinator.key(n, f"part/{node}") for node in range(parts.nodes)]
        coordinator.delete_with_next_round(part_keys)
        checkpoint = None
        failed: BaseException | None = None
        if parts.leader:
            try:
                reports = coordinator.reports(n, everyone=True)
                errors = [r["error"] for r in reports if r.get("error")]
                if errors:
                    raise CheckpointError("; ".join(errors))
                here = [r for r in reports if r.get("node") == parts.node]
                extra = {
                    "part": parts.node,
                    "parts": parts.nodes,
                    "id": decision.token,
                    "ranks": sorted(r["rank"] for r in here),
                }
                checkpoint = self._write_commit(save, decision, tmp, here, extra)
            except BaseException as e:
                # Said, and (on rank 0) announced below, before it is raised:
                # no rank waits for a key that nobody sets.
                failed = e
            coordinator.store.set(
                part_keys[parts.node],
                "ok" if failed is None else f"{type(failed).__name__}: {failed}",
            )
        if self.rank == 0:
            outcome = "ok"
            try:
                coordinator.wait_keys(n, part_keys, "every node to commit its part")
                problems = [r.decode() for r in coordinator.store.multi_get(part_keys)]
                outcome = "; ".join(p for p in problems if p != "ok") or "ok"
            except TimeoutError:
                outcome = f"timed out after {self.timeout:g} s waiting for the nodes' parts"
            coordinator.announce(n, outcome)
        if failed is not None:
            raise failed
        try:
            coordinator.committed(n)
        except BaseException:
            # Another node's part failed: this one is of a save that is not
            # whole, and a later save of the same step replaces it anyway.
            if checkpoint is not None:
                remove(checkpoint.path)
            raise
        final = save.tier.final(decision.step) if save.tier is not None else tmp
        if checkpoint is None:
            manifest, _ = read_manifest(final, decision.step)
            checkpoint = Checkpoint(final, decision.step, manifest or {"files": {}}, "memory")
        if parts.leader and save.tier is not None:
            save.tier.prune(decision.step, self._session)
            key = tier_key(self._key_prefix, (parts.node + 1) % parts.nodes)
            store = coordinator.store
            parts.committed(final, decision.step, lambda: _peer(store, key))
        return checkpoint

    def _write_commit(
        self,
        save: _Save,
        decision: Decision,
        tmp: Path,
        reports: list[dict[str, Any]],
        extra: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Rank 0 (a node leader for its part of a snapshot over several
        nodes, named by ``extra``): the manifest, the rename, the ``latest`` pointer."""
        assert save.tier is not None
        # Subdirectories' entries are fsynced there; tmp's own after the manifest.
        files = gather(tmp, reports, "checkpoint directory", "the with-block", save.tier.durable)
        save.tier.check_room(tmp, sum(size for size, _ in files.values()), decision.step)
        now = time.time()
        manifest = {
            "format": FORMAT,
            "step": decision.step,
            "created": datetime.fromtimestamp(now, timezone.utc).isoformat(),
            "created_unix": now,
            "world_size": self.world_size if self._coordinated else 1,
            "strategy": self.strategy,
            "forced": decision.forced,
            # From entering save() to this commit: what a stop warning must
            # leave room for (`relaunch doctor --ckpt-dir` compares them).
            "save_seconds": round(time.monotonic() - save.started, 3),
            "metrics": save.metrics,
            "metadata": save.metadata,
            "files": {n: {"size": s, "blake3": h} for n, (s, h) in sorted(files.items())},
        }
        if not self._coordinated and self.world_size > 1:
            manifest["rank"] = self.rank
        manifest.update(extra or {})
        manifest["blake3"] = _native.hash_bytes(canonical(manifest))
        write_atomic(
            tmp / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        )
        # Every file's entry and the manifest's are durable before the
        # directory takes its final name: the rename is the commit. A part
        # of the same step already there is of another save (one that was
        # not whole, or this node's replica from before the nodes were
        # numbered anew): replaced.
        final = save.tier.commit(tmp, decision.step, self._session, replace=extra is not None)
        return Checkpoint(final, decision.step, manifest, save.tier.name)

    def _abandon(self, tmp: Path, now: bool) -> None:
        """An aborted save's directory: removed now when no other rank may
        still write into it, else by rank 0 at its next save."""
        if now:
            remove(tmp)
        elif self._cleans_up:
            self._abandoned.append(tmp)

    def _remove_abandoned(self) -> None:
        while self._abandoned:
            remove(self._abandoned.pop())

    def _coordinator_(self) -> Coordinator:
        if self._coordinator is None:
            store = self._store_arg
            if store is None:
                connected = connect_store(self.timeout)
                if connected is None:
                    raise CheckpointError("no store to agree through (RELAUNCH_STORE is unset)")
                store = connected[0]
            self._coordinator = Coordinator(
                store, self._key_prefix, self.rank, self.world_size, self.timeout, failed_key()
            )
        return self._coordinator

    # --- asynchronous saves --------------------------------------------------------

    def save_async(
        self,
        state_dict: Any,
        step: int,
        name: str = "model.pt",
        *,
        force: bool = False,
        metrics: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Saves ``state_dict`` as file ``name`` of checkpoint ``step`` in the background.

        The caller is blocked only while the agreement runs and the tensors
        are copied to CPU memory; a background thread then ``torch.save``s
        the copy and commits, so the training loop may change the tensors at
        once. The next save (either kind) waits for this one; an error in the
        background is raised by the next call, :meth:`wait` or :meth:`close`.
        Returns whether a save started (False when none is due). Every rank
        calls it; in a multi-rank job give each rank its own ``name``, or
        ``None`` as ``state_dict`` on a rank with nothing to write (it joins
        the commit in the background all the same). The CPU
        copy is kept and reused by the next call (no allocation when the
        state has the same tensors); :meth:`close` frees it.
        """
        if not isinstance(name, str) or not safe_name(name) or name == MANIFEST:
            raise ValueError(
                f"name must be a relative file name inside the checkpoint, not {MANIFEST!r}, "
                f"'..' or an absolute path; got {name!r}"
            )
        import torch

        save = self.save(step, force, metrics=metrics, metadata=metadata)
        path = save.__enter__()
        if path is None:
            save.__exit__(None, None, None)
            return False
        try:
            if state_dict is None:
                state = None
            elif save.tier is self._memory and self._memory is not None:
                # Written in place on the caller (one copy into memory that
                # the next snapshot reuses); only the commit is left.
                self._snapshots.write(state_dict, path / name, self._memory.spare, torch)
                state = None
            else:
                state = self._stager.copy(state_dict, torch)
        except BaseException as e:
            if save.__exit__(type(e), e, e.__traceback__):
                return False  # a memory snapshot that did not fit, said in a warning
            raise
        # Not a daemon: the interpreter waits for a save in flight before it exits.
        thread = threading.Thread(
            target=self._write_async,
            args=(save, state, path / name, torch),
            name=f"relaunch-checkpoint-{step}",
        )
        self._async, self._async_step = thread, step
        with self._lock:
            # The with-block is still open until the thread ends; the next
            # save waits for the thread, so nothing else sees it as active.
            self._active = None
        thread.start()
        return True

    def _write_async(self, save: _Save, state: Any, file: Path, torch: Any) -> None:
        try:
            if state is not None:
                file.parent.mkdir(parents=True, exist_ok=True)
                torch.save(state, file)
        except BaseException as e:
            swallowed = False
            with contextlib.suppress(BaseException):
                swallowed = self._commit(save, e)
            if not swallowed:
                self._async_error = e
            return
        try:
            self._commit(save, None)
        except BaseException as e:
            self._async_error = e

    def _hand_off(self, pending: Any) -> None:
        """The open save is finished elsewhere (``relaunch.dcp``): the next
        save, :meth:`wait` and :meth:`close` wait for ``pending`` (something
        with ``join()`` and ``is_alive()``) as for a :meth:`save_async`."""
        with self._lock:
            self._async, self._async_step = pending, self._active.step if self._active else None
            self._active = None

    @property
    def pending(self) -> bool:
        """Whether a :meth:`save_async` is still writing or committing."""
        return self._async is not None and self._async.is_alive()

    def _wait_async(self) -> None:
        if self._async is not None:
            self._async.join()
            self._async = None

    def _raise_async_error(self) -> None:
        self._wait_async()
        error, self._async_error = self._async_error, None
        if error is not None:
            raise CheckpointError(
                f"the background save of step {self._async_step} failed, so it was not "
                f"committed: {type(error).__name__}: {error}"
            ) from error

    def wait(self) -> None:
        """Waits for a :meth:`save_async` in flight; raises its error, if any."""
        self._raise_async_error()

    def close(self) -> None:
        """Waits for a :meth:`save_async` in flight (raising its error), frees
        its CPU copy and removes what aborted saves left."""
        try:
            self._raise_async_error()
        finally:
            self._stager = Stager()  # lets go of the CPU copy
            self._snapshots.close()
            if self._parts is not None:
                self._parts.close()
            if self._cleans_up:
                self._remove_abandoned()
            if self._shipper is not None and not self._shipper.wait(exit_timeout()):
                warnings.warn(
                    f"checkpoint not shipped to {self._shipper.server} within the exit timeout "
                    "(RELAUNCH_EXIT_TIMEOUT); it stays in the local directory",
                    stacklevel=2,
                )

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _peer(store: Any, key: str) -> tuple[str, str] | None:
    """The next node's tier (address, secret), if it published one."""
    if not store.check([key]):
        return None
    peer = json.loads(store.get(key))
    return peer["address"], peer["secret"]


def _tell_preemption(checkpoint: Checkpoint) -> None:
    """A committed checkpoint of the agreed stop step is this rank's
    checkpoint of its stop (`relaunch.preemption.saved`), which the
    launcher's exit code 75 stands for. Only where the job uses
    preemption: this never imports it (importing installs handlers)."""
    preemption = sys.modules.get("relaunch.preemption")
    if preemption is not None and preemption.requested():
        preemption.saved(checkpoint.path, checkpoint.step)


def _tier_full(e: BaseException) -> bool:
    """Whether ``e`` says a memory snapshot did not fit: the tier's budget
    (here or on another rank) or its file system."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(e, CheckpointError) and TIER_FULL in str(e)


def _say_resume(newest: Checkpoint | None, found: list[Checkpoint]) -> None:
    """One line on stderr, from rank 0, when a memory tier is in use: which
    tier the job resumes from, and that a fresh launcher's is empty."""
    disk = next((c for c in found if c.tier == "disk"), None)
    if newest is None:
        return
    if newest.tier == "memory":
        older = f"; newest on disk: step {disk.step}" if disk is not None else ""
        print(
            f"relaunch.Checkpointer: resuming from the memory snapshot of step {newest.step}"
            f"{older}",
            file=sys.stderr,
            flush=True,
        )
    else:
        print(
            f"relaunch.Checkpointer: no newer memory snapshot on this node (a new launcher "
            f"starts with an empty memory tier): resuming from disk, step {newest.step}",
            file=sys.stderr,
            flush=True,
        )
