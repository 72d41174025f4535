"""cycling_utils' ``atomic_torch_save`` and ``AtomicDirectory``, with
cycling_utils' layout and relaunch's commit.

The calls and the layout are cycling_utils 0.0.3's: every rank builds the
saver and calls ``prepare_checkpoint_directory(force_save=)``, which returns
``OUTPUT/NAME_checkpoint_N`` (``..._N_force`` for a forced save), an empty
directory to write into; then every rank calls ``symlink_latest(that
directory)``, after which ``OUTPUT/NAME.latest_checkpoint`` points at it
(by absolute path) and the directory stays where it is. Tools that look for
those names (Strong Compute's artifact sync) and a resume that reads
``os.path.join(os.readlink(link), "checkpoint.pt")`` find them as before,
and each package resumes from the other's directories.

What the commit adds: the link is the commit, as in cycling_utils, but
before it moves every rank's files are fsynced and hashed into
``manifest.json`` (relaunch's checkpoint manifest) and the directory and
the link are fsynced; ranks agree through relaunch's store (``relaunch
run``, or torchrun's ``MASTER_ADDR``/``MASTER_PORT``), not torch.distributed
collectives, so no ``device`` and no process group are needed and a rank
that died is noticed. So:

- a kill at any instant leaves the link on a complete checkpoint (or on
  none before the first commit); a directory written after it (index higher
  than the link's) is unfinished and is removed by the next saver, as
  cycling_utils does;
- ``keep_last`` deletes old checkpoints only after the new one is committed
  (cycling_utils deletes them when the next save starts, so with
  ``keep_last=1`` a kill during a save leaves none), renamed out of the way
  first; forced checkpoints are kept, as there;
- a stale ``NAME.latest_checkpoint_temp`` link (a kill in the link swap) is
  removed, not an error forever after;
- ``sync_any`` keeps a save forced when any rank forces it, ``sync_all``
  only when every rank does, ``async`` and ``mono`` when the process does
  (``async`` names its saver ``NAME_rank_RANK``), as cycling_utils; savers
  built with different strategies on different ranks raise ``ValueError``.

Rank 0 creates, commits and prunes, whatever ``is_master`` says, and the
output directory must be shared by every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from relaunch import _native
from relaunch._checkpoint_agree import ENV_STORE, Coordinator, connect_store, failed_key
from relaunch._checkpoint_args import DEFAULT_TIMEOUT, ENV_ATTEMPT, ENV_RUN_ID, env, env_int
from relaunch._checkpoint_files import (
    FORMAT,
    MANIFEST,
    canonical,
    fsync,
    fsync_and_hash,
    gather,
    remove,
    walk,
    write_atomic,
)
from relaunch.errors import CheckpointError

__all__ = ["AtomicDirectory", "atomic_torch_save"]

STRATEGIES = ("sync_any", "sync_all", "async", "mono")
_SYNC = ("sync_any", "sync_all")

# Savers built in this process per (output directory, name, rank): the n-th
# saver of every rank meets the others' n-th under its own store keys.
_BUILT: dict[tuple[str, str, int], int] = {}
_BUILT_LOCK = threading.Lock()


# A temporary file of an interrupted save that no process of this host
# writes, or that nothing has written to for this long, is removed.
_STALE_TEMP_SECONDS = 600.0


def atomic_torch_save(obj: Any, f: str | os.PathLike[str], **kwargs: Any) -> None:
    """``torch.save(obj, f, **kwargs)`` whole or not at all: written under a
    temporary name in the same directory (``F.tmp-HOST-PID-RANDOM``),
    fsynced, renamed over ``f``, and the directory fsynced. A failure
    removes the temporary file; one that a killed save left is removed by
    the next save of ``f``."""
    import torch

    if not isinstance(f, str | os.PathLike):
        raise TypeError(f"f must be a path (str or os.PathLike), not {type(f).__name__}")
    path = Path(f)
    _remove_stale_temps(path)
    temp = path.with_name(
        f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-{os.urandom(4).hex()}"
    )
    try:
        torch.save(obj, temp, **kwargs)
        fsync(temp)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    fsync(path.parent if str(path.parent) else ".")


def _remove_stale_temps(path: Path) -> None:
    """Removes the temporary files of saves of ``path`` that were killed:
    those of this host whose process is gone, and any (another host's, or
    one named before the host was in the name) untouched for
    ``_STALE_TEMP_SECONDS``."""
    prefix = f"{path.name}.tmp-"
    host = socket.gethostname()
    try:
        entries = [e for e in os.scandir(path.parent or ".") if e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        writer, _, pid = entry.name[len(prefix) :].rpartition("-")[0].rpartition("-")
        gone = writer == host and pid.isdigit() and not _alive(int(pid))
        try:
            if not gone and time.time() - entry.stat().st_mtime < _STALE_TEMP_SECONDS:
                continue
            os.unlink(entry.path)
        except FileNotFoundError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class AtomicDirectory:
    """cycling_utils' ``AtomicDirectory(output_directory, is_master=False,
    name="AtomicDirectory", keep_last=-1, strategy="sync_any", device=...)``.

    ``keep_last``: how many of the newest checkpoints to keep (0 or less:
    all), forced ones aside. ``strategy``: ``"sync_any"``, ``"sync_all"``,
    ``"async"`` or ``"mono"``. ``device`` is accepted and unused.

    relaunch's additions, keyword-only: ``rank`` and ``world_size`` (default
    ``RANK`` and ``WORLD_SIZE``, else 0 and 1), ``store`` (a
    :class:`relaunch.Store` to agree through instead of the job's) and
    ``timeout`` (seconds to wait for the other ranks at each stage).
    """

    def __init__(
        self,
        output_directory: str | os.PathLike[str],
        is_master: bool = False,
        name: str = "AtomicDirectory",
        keep_last: int = -1,
        strategy: str = "sync_any",
        device: Any = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        store: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(output_directory, str | os.PathLike):
            raise TypeError(
                f"output_directory must be a path (str or os.PathLike), "
                f"not {type(output_directory).__name__}"
            )
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise ValueError(f"name must be a non-empty file name without '/', got {name!r}")
        if isinstance(keep_last, bool) or not isinstance(keep_last, int):
            raise ValueError(
                f"keep_last must be an int: N > 0 keeps the newest N checkpoints, -1 (or 0) "
                f"keeps every one; got {keep_last!r}"
            )
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; use one of {', '.join(map(repr, STRATEGIES))}"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.rank = env_int("RANK", 0) if rank is None else rank
        self.world_size = env_int("WORLD_SIZE", 1) if world_size is None else world_size
        for what, value in (("rank", self.rank), ("world_size", self.world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{what} must be an int, not {type(value).__name__}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is not in a world of {self.world_size} ranks "
                "(rank must be in 0..world_size-1)"
            )
        self.output_directory = os.fspath(output_directory)
        self.is_master = bool(is_master) or strategy in ("async", "mono")
        self.keep_last = keep_last
        self.strategy = strategy
        self.device = device
        self.name = f"{name}_rank_{self.rank}" if strategy == "async" else name
        self.symlink_name = f"{self.name}.latest_checkpoint"
        # Resolved once: a later chdir moves nothing.
        self._out = Path(os.path.abspath(self.output_directory))
        self._pattern = re.compile(rf"^{re.escape(self.name)}_checkpoint_(\d+)(_force)?$")
        self._aside = re.compile(
            rf"^\.{re.escape(self.name)}_checkpoint_\d+(_force)?\.old-[0-9a-f]+$"
        )
        self._coordinated = strategy in _SYNC and self.world_size > 1
        # The process that creates, commits and prunes this saver's directories.
        self._committer = not self._coordinated or self.rank == 0
        self._timeout = float(timeout)
        if self._out.exists() and not self._out.is_dir():
            raise NotADirectoryError(
                f"output_directory {self._out} exists and is not a directory; pass the path "
                "of a directory (it is created if missing)"
            )
        self._out.mkdir(parents=True, exist_ok=True)

        self._coordinator: Coordinator | None = None
        if strategy != "mono" and self.world_size > 1:
            self._agree_on_strategy(name, store)
        self._shipper = self._make_shipper()
        self._open: tuple[int, Path, int, bool] | None = None
        self._next = self._recover() + 1

    # --- construction ------------------------------------------------------------

    def _agree_on_strategy(self, base_name: str, store: Any) -> None:
        """Every rank publishes its strategy and reads the others' (cycling_utils
        does so with an all_gather), through the store the saves agree through."""
        if store is None:
            if (
                self._coordinated
                and os.environ.get(ENV_STORE) is None
                and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"))
            ):
                raise ValueError(
                    f"AtomicDirectory(strategy={self.strategy!r}) needs a store to agree across "
                    f"{self.world_size} ranks: run under `relaunch run` (it sets RELAUNCH_STORE) "
                    "or torchrun (MASTER_ADDR/MASTER_PORT), or pass store=relaunch.Store(host, "
                    'port); or use strategy="async" or "mono"'
                )
            connected = connect_store(self._timeout)
            if connected is None:  # async without a store: nothing to check with
                return
            store = connected[0]
        run_id, attempt = env(ENV_RUN_ID), env(ENV_ATTEMPT)
        key = (str(self._out), base_name, self.rank)
        with _BUILT_LOCK:
            built = _BUILT.get(key, 0)
            _BUILT[key] = built + 1
        where = _native.hash_bytes(f"{self._out}/{base_name}".encode())[:12]
        prefix = (
            f"relaunch/{run_id}/workers/cycling_utils/" if run_id else "relaunch/cycling_utils/"
        ) + f"{where}/{attempt or 0}/{built}/"
        coordinator = Coordinator(
            store, prefix, self.rank, self.world_size, self._timeout, failed_key()
        )
        store.set(f"{prefix}strategy/{self.rank}", self.strategy)
        keys = [f"{prefix}strategy/{r}" for r in range(self.world_size)]
        try:
            coordinator.wait_keys(0, keys, "every rank to build its AtomicDirectory")
        except TimeoutError:
            absent = [str(r) for r, k in enumerate(keys) if not store.check([k])]
            raise CheckpointError(
                f"AtomicDirectory {base_name!r}: timed out after {self._timeout:g} s waiting "
                f"for rank(s) {', '.join(absent)} to build theirs (every rank builds the "
                "saver, with the same name)"
            ) from None
        strategies = [raw.decode() for raw in store.multi_get(keys)]
        if len(set(strategies)) > 1:
            by_rank = ", ".join(f"rank {r}: {s!r}" for r, s in enumerate(strategies))
            raise ValueError(
                f"AtomicDirectory {base_name!r} was built with different strategies ({by_rank}); "
                "build it with the same strategy on every rank"
            )
        if self._coordinated:
            coordinator.prefix = f"{prefix}rounds/"
            self._coordinator = coordinator

    def _make_shipper(self) -> Any:
        """As relaunch.Checkpointer: under ``relaunch run --server`` the
        committing process uploads each checkpoint in the background."""
        server = os.environ.get("RELAUNCH_SERVER", "").strip()
        run = os.environ.get("RELAUNCH_RUN_ID", "").strip()
        if not (server and run and self._committer):
            return None
        from relaunch._checkpoint_ship import Shipper

        return Shipper(server, os.environ.get("RELAUNCH_SERVER_TOKEN") or None, run)

    def _checkpoints(self) -> dict[str, tuple[int, bool]]:
        """This saver's ``NAME_checkpoint_N[_force]`` directories: name -> (N, forced)."""
        found = {}
        for entry in os.scandir(self._out):
            match = self._pattern.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                found[entry.name] = (int(match.group(1)), bool(match.group(2)))
        return found

    def _linked(self) -> tuple[str | None, str | None]:
        """The link's target and, when it names one of this saver's
        directories, that directory's name."""
        link = self._out / self.symlink_name
        try:
            target = os.readlink(link)
        except (FileNotFoundError, OSError):
            return None, None
        base = os.path.basename(os.path.normpath(target))
        return target, base if self._pattern.match(base) else None

    def _recover(self) -> int:
        """The index of the committed checkpoint (-1: none); the committer
        removes what a killed save left behind."""
        target, base = self._linked()
        link = self._out / self.symlink_name
        if target is not None and base is None:
            ours = sorted(self._checkpoints())
            if ours:
                raise ValueError(
                    f"{link} points at {target}, which is not one of this saver's "
                    f"{self.name}_checkpoint_N directories, and {len(ours)} such directories "
                    f"exist ({', '.join(ours[:3])}{', ...' if len(ours) > 3 else ''}): point the "
                    "link at the checkpoint to resume from, or move the link away"
                )
            return -1  # e.g. a link made by hand: resumed from, replaced by the first save
        committed = -1
        if base is not None:
            committed = int(self._pattern.match(base).group(1))  # type: ignore[union-attr]
            if not (self._out / base).is_dir() and self.rank == 0:
                warnings.warn(
                    f"{link} points at {target}, which does not exist: there is no checkpoint "
                    f"to resume from; the next save is {self.name}_checkpoint_{committed + 1}",
                    stacklevel=3,
                )
        if self._committer:
            unlinked = sorted(d for d, (n, _) in self._checkpoints().items() if n > committed)
            if target is None and unlinked:
                warnings.warn(
                    f"{self._out} holds {', '.join(unlinked)} but no {self.symlink_name} link: "
                    "saves that never finished (cycling_utils' rule), so they are removed",
                    stacklevel=3,
                )
            stale = self._out / f"{self.symlink_name}_temp"
            if stale.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            for entry in os.scandir(self._out):
                if self._aside.match(entry.name):
                    remove(Path(entry.path))
            self._remove_from(committed + 1)
        return committed

    def _remove_from(self, index: int) -> None:
        """Removes this saver's directories from ``index`` on (never finished):
        renamed out of the way, then deleted."""
        for dirname, (n, _) in sorted(self._checkpoints().items()):
            if n >= index:
                self._delete(dirname)

    def _delete(self, dirname: str) -> None:
        aside = self._out / f".{dirname}.old-{os.urandom(4).hex()}"
        try:
            os.rename(self._out / dirname, aside)
        except FileNotFoundError:
            return
        remove(aside)

    # --- cycling_utils' calls ----------------------------------------------------

    def is_checkpoint_directory(self, path_str: str | os.PathLike[str]) -> str | None:
        """As cycling_utils: for an existing ``NAME_checkpoint_N[_force]``
        directory of this saver, its suffix (``"N"`` or ``"N_force"``), else None."""
        path = Path(path_str)
        match = self._pattern.match(path.name)
        if match is None or not path.is_dir():
            return None
        return match.group(1) + (match.group(2) or "")

    def prepare_checkpoint_directory(self, force_save: bool = False) -> str:
        """Every rank: the empty directory this save writes into,
        ``OUTPUT/NAME_checkpoint_N`` (``..._force`` when the strategy keeps
        the save forced). A save prepared before and never finished with
        :meth:`symlink_latest` is abandoned (nothing of it is committed)."""
        if isinstance(force_save, str | bytes):
            raise TypeError(f"force_save must be a bool, not {type(force_save).__name__}")
        force = bool(force_save)
        if self._open is not None:
            self._abandon()
        _native.heartbeat()
        index = self._next
        coordinator = self._coordinator
        n = -1
        if coordinator is not None:
            n = coordinator.round
            # A vote whose "save" is the agreed force: any rank's under
            # sync_any, every rank's under sync_all (cycling_utils' rule).
            try:
                decision = coordinator.vote(index, force, False, self.strategy, "cycling")
            except ValueError as e:
                raise ValueError(
                    f"the ranks disagree on the next checkpoint of {self.name!r}: {e} (here: "
                    "the index N of NAME_checkpoint_N; every rank builds its saver before the "
                    "first save and prepares the same saves)"
                ) from None
            force = decision.save
            keys = ["written", "writers", "outcome", "commit", "prepared"]
            keys += [f"report/{r}" for r in range(coordinator.world)]
            coordinator.delete_with_next_round([coordinator.key(n, k) for k in keys])
        path = self._out / f"{self.name}_checkpoint_{index}{'_force' if force else ''}"
        if self._committer:
            try:
                # What an abandoned save of this index left (every rank has
                # left it: all of them voted for this one).
                self._remove_from(index)
                path.mkdir()
            except BaseException as e:
                if coordinator is not None:
                    coordinator.store.set(
                        coordinator.key(n, "prepared"), f"{type(e).__name__}: {e}"
                    )
                raise
            if coordinator is not None:
                coordinator.store.set(coordinator.key(n, "prepared"), "ok")
        elif coordinator is not None:
            said = coordinator.wait_key(
                n, coordinator.key(n, "prepared"), "rank 0 to create the checkpoint directory"
            ).decode()
            if said != "ok":
                raise CheckpointError(f"rank 0 could not create {path}: {said}")
        self._open = (n, path, index, force)
        self._started = time.monotonic()
        return str(path)

    def symlink_latest(self, checkpoint_directory: str | os.PathLike[str]) -> None:
        """Every rank: commit the prepared checkpoint once every rank has
        called this, and point ``NAME.latest_checkpoint`` at it."""
        if self._open is None:
            raise RuntimeError(
                "symlink_latest() without prepare_checkpoint_directory(): prepare a directory, "
                "write the checkpoint into it, then call symlink_latest(that directory)"
            )
        n, path, index, forced = self._open
        if os.path.abspath(os.fspath(checkpoint_directory)) != str(path):
            raise ValueError(
                f"{checkpoint_directory} is not the directory prepare_checkpoint_directory() "
                f"gave ({path})"
            )
        self._open = None
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.leave_block(n, None)
        rank, world = (self.rank, self.world_size) if coordinator is not None else (0, 1)
        report: dict[str, Any] = {"seen": {}, "hashed": {}, "error": None}
        try:
            report["seen"] = walk(path)
            report["hashed"] = fsync_and_hash(path, sorted(report["seen"])[rank::world])
        except Exception as e:
            if coordinator is None:
                raise
            report["error"] = f"rank {rank}: {type(e).__name__}: {e}"
            if rank != 0:
                coordinator.report(n, report)
                raise
        if coordinator is not None and rank != 0:
            coordinator.report(n, report)
            coordinator.committed(n)
        else:
            try:
                reports = [report]
                if coordinator is not None and report["error"] is None:
                    reports += coordinator.reports(n)
                errors = [r["error"] for r in reports if r.get("error")]
                if errors:
                    raise CheckpointError("; ".join(errors))
                self._commit(path, index, forced, reports)
            except BaseException as e:
                if coordinator is not None:
                    with contextlib.suppress(Exception):
                        coordinator.announce(n, f"{type(e).__name__}: {e}")
                raise
            if coordinator is not None:
                coordinator.announce(n, "ok")
            if self._shipper is not None:
                self._shipper.ship(index, path)
            self._prune(index)
        self._next = index + 1
        _native.heartbeat()

    # --- the commit ----------------------------------------------------------------

    def _commit(self, path: Path, index: int, forced: bool, reports: list[dict[str, Any]]) -> None:
        """The committer: the manifest, everything fsynced, then the link."""
        files = gather(path, reports, "output directory", "symlink_latest()")
        now = time.time()
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "step": index,
            "created": datetime.fromtimestamp(now, timezone.utc).isoformat(),
            "created_unix": now,
            "world_size": self.world_size if self._coordinated else 1,
            "strategy": self.strategy,
            "forced": forced,
            "save_seconds": round(time.monotonic() - self._started, 3),
            "metrics": {},
            "metadata": {"cycling_utils": self.name},
            "files": {n: {"size": s, "blake3": h} for n, (s, h) in sorted(files.items())},
        }
        if not self._coordinated and self.world_size > 1:
            manifest["rank"] = self.rank
        manifest["blake3"] = _native.hash_bytes(canonical(manifest))
        write_atomic(
            path / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        )
        # The files, the manifest and the directory's own entry are durable
        # before the link moves: the link is the commit.
        fsync(path)
        fsync(self._out)
        temp = self._out / f"{self.symlink_name}_temp"
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        os.symlink(str(path), temp)
        os.replace(temp, self._out / self.symlink_name)
        fsync(self._out)

    def _prune(self, committed: int) -> None:
        """After a commit: the checkpoints ``keep_last`` does not keep (never a
        forced one, never the one just committed)."""
        if self.keep_last <= 0:
            return
        for dirname, (n, forced) in sorted(self._checkpoints().items()):
            if not forced and n <= committed - self.keep_last:
                self._delete(dirname)

    def _abandon(self) -> None:
        """A prepared save never committed: nothing of it is; its directory
        goes at the next prepare, once every rank has left it."""
        assert self._open is not None
        n = self._open[0]
        self._open = None
        if self._coordinator is not None:
            with contextlib.suppress(Exception):
                self._coordinator.leave_block(
                    n, "prepare_checkpoint_directory() again before symlink_latest()"
                )
